// Package docs holds the project's documentation; its test checks that every link in README.md
// and docs/ resolves to a file of the repository.
package docs

import (
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// mdLink matches the target of a Markdown link: [text](target).
var mdLink = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// TestLinksResolveInsideTheRepository reads README.md and every Markdown file under docs/,
// examples/ and deploy/, and fails for a relative link whose file does not exist or that leaves the
// repository, and for any link to a host other than loopback (the docs point only at what a
// clone has).
func TestLinksResolveInsideTheRepository(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files := []string{filepath.Join(root, "README.md")}
	for _, dir := range []string{"docs", "examples", "deploy"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && strings.HasSuffix(p, ".md") {
				files = append(files, p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	links := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range mdLink.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			rel, _ := filepath.Rel(root, f)
			if u, err := url.Parse(target); err == nil && u.Scheme != "" {
				t.Errorf("%s: link %q points outside the repository", rel, target)
				continue
			}
			target, _, _ = strings.Cut(target, "#")
			if target == "" {
				continue // an anchor in the same file
			}
			p := filepath.Clean(filepath.Join(filepath.Dir(f), target))
			if r, err := filepath.Rel(root, p); err != nil || strings.HasPrefix(r, "..") {
				t.Errorf("%s: link %q leaves the repository", rel, m[1])
				continue
			}
			if _, err := os.Stat(p); err != nil {
				t.Errorf("%s: link %q: %v", rel, m[1], err)
			}
			links++
		}
	}
	if links == 0 {
		t.Fatal("found no links at all: the link pattern is broken")
	}
}
