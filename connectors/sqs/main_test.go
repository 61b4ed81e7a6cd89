package sqs_test

import (
	"os"
	"testing"

	"github.com/epochflow/epochflow/internal/sqstest"
)

// emu is the goaws emulator of this test binary (goaws state is per process).
var emu *sqstest.Emulator

// The emulator is served from this test process, instrumented by the race detector like the
// source, unless EPOCHFLOW_SQSTEST_EMULATOR=process: these tests wait on epochs and timeouts
// rather than on goaws, so the package takes as long either way. TestReceivingWaitsForDeletes
// is flaky in both (20-70 stale deletes of 3,000; in process 1 run in 9 at load 16, with the
// faster emulator process 2 in 8): the receiver can run past deletes that are 100 ms late,
// which is the source's to fix.
func TestMain(m *testing.M) {
	if os.Getenv("EPOCHFLOW_SQSTEST_EMULATOR") == "process" {
		sqstest.Main(m, &emu)
	}
	sqstest.MainInProcess(m, &emu)
}
