package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/connectors/kafka"
	"github.com/epochflow/epochflow/connectors/nats"
	"github.com/epochflow/epochflow/connectors/pgrepl"
	"github.com/epochflow/epochflow/connectors/sqs"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/recovery"
)

func encode[S any](t *testing.T, s S) []byte {
	t.Helper()
	b, err := dataflow.DefaultCodec[S]().Encode(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Each connector's partition state, encoded as the engine stores it, is told in words; a
// keyed step's state is not.
func TestDescribePosition(t *testing.T) {
	lsn, _ := pgrepl.ParseLSN("0/16B3748")
	commit, _ := pgrepl.ParseLSN("0/16B4000")
	for _, c := range []struct {
		key   string
		state []byte
		want  string // a substring; "" for no words
	}{
		{"/data/in.txt", encode(t, int64(947)), "byte offset 947:"},
		{"/data/out.txt", encode(t, int64(0)), "byte offset 0:"},
		{"slot/orders", encode(t, pgrepl.State{LSN: lsn}), "LSN 0/16B3748: replication resumes after"},
		{"slot/orders", encode(t, pgrepl.State{LSN: lsn, TxCommit: commit, TxEvents: 7}), "skipping the first 7 events of the transaction that commits at 0/16B4000"},
		{"slot/orders", encode(t, pgrepl.State{LSN: lsn, Copying: true}), "the initial copy is not finished"},
		{"orders/3", encode(t, int64(1234)), "offset 1234: the next record to read"},
		{"consumer-0", encode(t, uint64(42)), "snapshot 42: a queue consumer acknowledges"},
		{"publisher-1", encode(t, uint64(900)), "900 messages published and confirmed"},
		{"http://127.0.0.1:4100/100010001000/q#0", encode(t, uint64(5)), "snapshot 5: the SQS consumer deletes"},
		{"http://127.0.0.1:4100/100010001000/q#1", encode(t, sqs.SinkState{Seq: 3, Run: "r1"}), "snapshot 3 of run r1"},
		{"ORDERS/copy", encode(t, nats.QueueState{Snapshot: 4, Done: 77}), "stream sequence 77 done"},
		{"publisher-0", encode(t, nats.SinkState{Epoch: 9, Items: 120}), "epoch 9, 120 messages: what the sink published"},
		{"publisher-0", []byte(`{"epoch":9}`), "epoch 9: what the sink published"},
		{"orders/0", encode(t, kafka.SinkState{Seq: 2, Txns: []kafka.Txn{{Seq: 2}}}), "snapshot 2, 1 transactions flushed"},
		{"apple", encode(t, 12), ""},
		{"", encode(t, "a state"), ""},
		{"/data/in.txt", []byte("not a varint \xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"), ""},
	} {
		got := describePosition(c.key, c.state)
		if (c.want == "") != (got == "") || !strings.Contains(got, c.want) {
			t.Errorf("describePosition(%q, %x) = %q, want %q", c.key, c.state, got, c.want)
		}
	}
}

// inspect of the store of a real run shows where the file source and the file sink resume:
// the input's size and the output's length.
func TestInspectShowsPositions(t *testing.T) {
	dir := t.TempDir()
	in, out := filepath.Join(dir, "in.txt"), filepath.Join(dir, "out.txt")
	if err := os.WriteFile(in, []byte(strings.Repeat("a line\n", 100)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	store, err := recovery.OpenSQLite(ctx, filepath.Join(dir, "store"), recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f := dataflow.New("copy")
	dataflow.Output("write", dataflow.Input(f, "read", file.Lines(in)), file.LinesOut(out, func(s string) string { return s + "!" }))
	if err := dataflow.Run(ctx, f, dataflow.Options{Recovery: store, EpochInterval: 10 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	store.Close()
	var stdout, stderr strings.Builder
	if code := run(ctx, []string{"recovery", "inspect", filepath.Join(dir, "store")}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	for _, want := range []string{
		"STEP        PARTITION",
		fmt.Sprintf("copy.read   %s  ", in), "byte offset 700:",
		fmt.Sprintf("copy.write  %s ", out), "byte offset 800:",
		"POSITION: where each source or sink partition resumes",
		"FRONTIERS: for each worker",
	} {
		if !strings.Contains(stdout.String(), want) {
			t.Errorf("inspect does not print %q:\n%s", want, stdout.String())
		}
	}
}

// epochflow graph reads /dataflow from a running flow's monitor (or a file) and prints the
// flow's Mermaid chart, as -graph does.
func TestGraphCommand(t *testing.T) {
	f := dataflow.New("g")
	in := dataflow.Input(f, "read", file.Lines("/nonexistent"))
	dataflow.Output("write", dataflow.Redistribute("spread", in), file.LinesOut("/nonexistent-out", func(s string) string { return s }))
	srv := httptest.NewServer(dataflow.NewMonitor().Handler(f, false))
	defer srv.Close()
	var stdout, stderr strings.Builder
	if code := run(context.Background(), []string{"graph", srv.URL + "/dataflow"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if stdout.String() != f.Mermaid() || !strings.Contains(stdout.String(), "-- exchange -->") {
		t.Fatalf("graph printed\n%s\nwant\n%s", stdout.String(), f.Mermaid())
	}
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte(`{"nope": 1}`), 0o644)
	for _, c := range []struct {
		args   []string
		code   int
		stderr string
	}{
		{[]string{"graph"}, 2, "usage: epochflow graph SOURCE"},
		{[]string{"graph", "a", "b"}, 2, "usage: epochflow graph SOURCE"},
		{[]string{"graph", bad}, 1, "not the JSON of a flow's graph"},
		{[]string{"graph", srv.URL + "/nothing"}, 1, "404"},
	} {
		stdout.Reset()
		stderr.Reset()
		if code := run(context.Background(), c.args, &stdout, &stderr); code != c.code || !strings.Contains(stderr.String(), c.stderr) {
			t.Errorf("epochflow %q: exit %d, stderr %q; want %d and %q", c.args, code, stderr.String(), c.code, c.stderr)
		}
	}
}

// Every command takes -h and -help, prints its usage on standard output and exits 0.
func TestCommandsTakeHelp(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-h"}, "usage: epochflow recovery inspect PATH\n       epochflow graph SOURCE"},
		{[]string{"-help"}, "Each command takes -h or -help."},
		{[]string{"recovery", "-h"}, "usage: epochflow recovery inspect PATH\n\nPrints"},
		{[]string{"recovery", "inspect", "-h"}, "FRONTIERS"},
		{[]string{"recovery", "inspect", "-help"}, "POSITION"},
		{[]string{"graph", "-h"}, "usage: epochflow graph SOURCE"},
		{[]string{"graph", "-help"}, "epochflow graph http://127.0.0.1:9090/dataflow"},
	} {
		var stdout, stderr strings.Builder
		if code := run(context.Background(), c.args, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), c.want) || stderr.Len() > 0 {
			t.Errorf("epochflow %q: exit %d, stdout %q, stderr %q; want 0 and %q", c.args, code, stdout.String(), stderr.String(), c.want)
		}
	}
}
