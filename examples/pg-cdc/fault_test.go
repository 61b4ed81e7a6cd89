package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/epochflow/epochflow/internal/pgtest"
	"github.com/jackc/pgx/v5"
)

// One run of the example, with its target on a cluster of its own, while a writer runs 5,000
// transactions on the source table: the target server is restarted twice with -m fast and
// twice with -m immediate (pg_ctl restart), at least twice while the writer runs, and the run
// carries on (it reconnects; it never exits). Stopped with SIGTERM once the target caught up,
// it exits 0, and the target equals the source, with no prepared transaction and no logged
// row left, and no row version written twice (checkWrittenOnce).
func TestPgCdcSurvivesTargetRestarts(t *testing.T) {
	bin := buildBinary(t)
	ctx := context.Background()
	target, err := pgtest.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer target.Stop()
	srcDSN, err := cluster.CreateDB(ctx, "restarts_source")
	if err != nil {
		t.Fatal(err)
	}
	tgtDSN, err := target.CreateDB(ctx, "restarts_target")
	if err != nil {
		t.Fatal(err)
	}
	src := connect(t, srcDSN)
	const columns = "id int PRIMARY KEY, v text NOT NULL, n int, big text"
	mustExec(t, src, "CREATE TABLE items ("+columns+")")
	stampVersions(t, src)
	const existing = 10_000
	mustExec(t, src, "INSERT INTO items (id, v, n) SELECT g, 'existing' || g, g % 13 FROM generate_series(1, $1::int) g", existing)
	recordVersions(t, connect(t, tgtDSN), columns)
	defer func() {
		eventually(t, "dropping the slot", func() bool {
			_, err := src.Exec(ctx, "SELECT pg_drop_replication_slot('restarts')")
			return err == nil
		})
	}()
	var stderr bytes.Buffer
	cmd := flowCommand(bin, "-source", srcDSN, "-target", tgtDSN, "-table", "items", "-slot", "restarts", "-publication", "restarts",
		"-recovery", filepath.Join(t.TempDir(), "store"), "-epoch-interval", "100ms", "-log-level", "warn")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-exited
	}()
	alive := func(when string) {
		t.Helper()
		select {
		case err := <-exited:
			exited <- err
			t.Fatalf("the run ended %s: %v\n%s", when, err, stderr.String())
		default:
		}
	}

	// The writer starts once the initial copy is committed: changes committed while the copy
	// reads would reach the target twice, in the copy and from the slot, by design.
	tgtCount := func() int {
		tgt, err := pgx.Connect(ctx, tgtDSN)
		if err != nil {
			return -1
		}
		defer tgt.Close(ctx)
		n := -1
		tgt.QueryRow(ctx, "SELECT count(*) FROM items").Scan(&n)
		return n
	}
	for deadline := time.Now().Add(2 * time.Minute); tgtCount() != existing; time.Sleep(50 * time.Millisecond) {
		alive("copying")
		if time.Now().After(deadline) {
			t.Fatalf("the initial copy did not complete in 2 minutes\n%s", stderr.String())
		}
	}

	const txs = 5_000
	var written atomic.Int64
	werr := make(chan error, 1)
	go func() { werr <- writer(ctx, srcDSN, txs, existing+1, uint64(time.Now().UnixNano()), &written) }()
	restartsWriting := 0
	for i, mode := range []string{"fast", "immediate", "fast", "immediate"} {
		at := int64(250 + 1000*i)
		deadline := time.Now().Add(2 * time.Minute)
		for written.Load() < at && len(werr) == 0 {
			alive("before a restart")
			if time.Now().After(deadline) {
				t.Fatalf("the writer is at %d transactions after 2 minutes, waiting for %d", written.Load(), at)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if written.Load() < txs {
			restartsWriting++
		}
		if err := target.Restart(mode); err != nil {
			t.Fatal(err)
		}
		alive("after the " + mode + " restart")
	}
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	if restartsWriting < 2 {
		t.Fatalf("only %d of the 4 target restarts came while the writer ran (it wrote %d transactions): want at least 2", restartsWriting, written.Load())
	}
	want := strings.Join(tableText(t, src), "\n")
	var got string
	deadline := time.Now().Add(2 * time.Minute)
	for got != want {
		alive("catching up")
		if time.Now().After(deadline) {
			t.Fatalf("the target did not catch up with the source in 2 minutes\n%s", stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
		func() {
			tgt, err := pgx.Connect(ctx, tgtDSN)
			if err != nil {
				return
			}
			defer tgt.Close(ctx)
			got = strings.Join(tableText(t, tgt), "\n")
		}()
	}
	cmd.Process.Signal(syscall.SIGTERM)
	err = <-exited
	exited <- err
	if err != nil {
		t.Fatalf("the run, stopped with SIGTERM: %v\n%s", err, stderr.String())
	}
	tgt := connect(t, tgtDSN)
	if got := strings.Join(tableText(t, tgt), "\n"); got != want {
		t.Fatal("after the stop, the target differs from the source")
	}
	var prepared, logged int
	tgt.QueryRow(ctx, "SELECT count(*) FROM pg_prepared_xacts").Scan(&prepared)
	tgt.QueryRow(ctx, "SELECT count(*) FROM epochflow_sink_log").Scan(&logged)
	if prepared != 0 || logged != 0 {
		t.Fatalf("%d prepared transactions and %d logged rows left behind", prepared, logged)
	}
	versions := checkWrittenOnce(t, tgt)
	t.Logf("%d transactions, 4 target restarts (%d while the writer ran), %d rows, %d row versions written once each",
		written.Load(), restartsWriting, len(strings.Split(want, "\n")), versions)
}
