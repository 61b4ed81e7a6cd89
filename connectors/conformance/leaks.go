package conformance

import (
	"bytes"
	"runtime"
	"strings"
	"time"
)

// goroutines returns the stacks of the live goroutines by id.
func goroutines() map[string]string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	out := map[string]string{}
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		head, _, _ := bytes.Cut(g, []byte("\n"))
		// "goroutine 42 [select]:"
		f := strings.Fields(string(head))
		if len(f) >= 2 && f[0] == "goroutine" {
			out[f[1]] = string(g)
		}
	}
	return out
}

// leakGrace is how long leaked waits for goroutines to end (a variable for the kit's own
// tests of connectors that leak).
var leakGrace = 5 * time.Second

// leakCheck remembers the goroutines that run before a check.
type leakCheck struct {
	before map[string]string
	ignore []string
}

func startLeakCheck(ignore []string) leakCheck {
	return leakCheck{before: goroutines(), ignore: ignore}
}

// leaked returns the stacks of goroutines started since the check began that are still
// running after a grace of a few seconds, leakGrace (a closed client's goroutines take a moment to
// end), except those with a frame in an ignored package (an embedded server's).
func (l leakCheck) leaked() []string {
	deadline := time.Now().Add(leakGrace)
	for {
		var out []string
		for id, g := range goroutines() {
			if _, ok := l.before[id]; ok || l.ignored(g) {
				continue
			}
			out = append(out, g)
		}
		if len(out) == 0 || time.Now().After(deadline) {
			return out
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (l leakCheck) ignored(stack string) bool {
	for _, p := range l.ignore {
		if strings.Contains(stack, p) {
			return true
		}
	}
	return false
}
