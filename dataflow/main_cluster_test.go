package dataflow

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

// The cluster flags: a pod name gives its ordinal, and a cluster without a secret, a process
// id outside the list and -recovery with several processes are refused naming the flag.
func TestClusterFlags(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int // process, or -1 for refused
		err  string
	}{
		{args: nil, want: 0},
		{args: []string{"-addresses", "a:1,b:2", "-process-id", "flow-1", "-cluster-secret", "s"}, want: 1},
		{args: []string{"-addresses", "a:1,b:2", "-process-id", "1"}, want: -1, err: "-cluster-secret"},
		{args: []string{"-addresses", "a:1,b:2", "-process-id", "2", "-cluster-secret", "s"}, want: -1, err: "-process-id"},
		{args: []string{"-addresses", "a:1,b", "-cluster-secret", "s"}, want: -1, err: "-addresses"},
		{args: []string{"-process-id", "3"}, want: -1, err: "needs -addresses"},
	} {
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		cf := addClusterFlags(fs)
		if err := fs.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		var stderr bytes.Buffer
		opts, ok := cf.options(&stderr, "")
		switch {
		case c.want < 0 && (ok || !strings.Contains(stderr.String(), c.err)):
			t.Errorf("%v: ok=%v, error %q, want one naming %s", c.args, ok, stderr.String(), c.err)
		case c.want >= 0 && !ok:
			t.Errorf("%v: refused: %s", c.args, stderr.String())
		case c.want > 0 && opts.Process != c.want:
			t.Errorf("%v: process %d, want %d", c.args, opts.Process, c.want)
		}
	}
	var stderr bytes.Buffer
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	cf := addClusterFlags(fs)
	fs.Parse([]string{"-addresses", "a:1,b:2", "-cluster-secret", "s"})
	if _, ok := cf.options(&stderr, "/tmp/store"); ok || !strings.Contains(stderr.String(), "-recovery") {
		t.Errorf("-recovery with a cluster: ok=%v, %q", ok, stderr.String())
	}
}
