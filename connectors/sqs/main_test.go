package sqs_test

import (
	"testing"

	"github.com/epochflow/epochflow/internal/sqstest"
)

// emu is the goaws emulator of this test binary (goaws state is per process).
var emu *sqstest.Emulator

func TestMain(m *testing.M) { sqstest.Main(m, &emu) }
