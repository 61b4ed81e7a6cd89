package windows_test

import (
	"flag"
	"log/slog"
	"os"
	"testing"
)

var quiet = slog.New(slog.DiscardHandler)

// defaultChecks is how many cases each property test tries unless -rapid.checks says otherwise:
// every case runs a flow (up to three times, with crashes) on a recovery store, so rapid's
// default of 100 would take a minute under -race.
const defaultChecks = "12"

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "rapid.checks" })
	if !set {
		if err := flag.Set("rapid.checks", defaultChecks); err != nil {
			panic(err)
		}
	}
	os.Exit(m.Run())
}
