package dataflow

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

// Every variable that sets a flag is named in the flag's usage, "(env NAME)", so that -help
// lists them all: deploy/kubernetes's test reads the variables a binary accepts from its -help.
func TestUsageNamesEveryVariable(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var stderr bytes.Buffer
	if code := mainFunc(fs, []string{"-help"}, &stderr, &stderr, nil); code != 0 {
		t.Fatalf("-help: exit %d", code)
	}
	for _, ev := range envFlags {
		f := fs.Lookup(ev.flag)
		if f == nil {
			t.Errorf("%s sets -%s, which is not a flag", ev.env, ev.flag)
			continue
		}
		if !strings.Contains(f.Usage, "(env "+ev.env) {
			t.Errorf("the usage of -%s does not name %s: %q", ev.flag, ev.env, f.Usage)
		}
	}
}
