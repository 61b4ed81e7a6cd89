package pgstore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/epochflow/epochflow/recovery/internal/runfmt"
)

// How runs (chunk.go) live in the tables: a row of runs per run (its step, entry and chunk
// counts, bytes, the sum of its chunks' checksums and the epoch of the commit that wrote it),
// its chunks as rows of chunks, keyed by (run, seq); and per step, a row of step_sums with
// the entry count and the checksum sum over its runs, all written in the commit's
// transaction.

// runInfo is a row of table runs.
type runInfo struct {
	id      int64
	step    string
	entries int64
	chunks  int
	bytes   int64
	sum     uint64 // the sum of its chunks' checksums
	epoch   uint64 // the commit that wrote it
}

// stepSum is a step's row of step_sums, or the totals of its runs.
type stepSum struct {
	entries int64
	sum     uint64
}

// totals is the stepSum of runs.
func totals(runs []runInfo) stepSum {
	var t stepSum
	for _, r := range runs {
		t.entries += r.entries
		t.sum += r.sum
	}
	return t
}

// readRuns returns the runs of step, oldest first.
func (s *Store) readRuns(ctx context.Context, tx pgx.Tx, step string) ([]runInfo, error) {
	rows, err := tx.Query(ctx, `SELECT id, entries, chunks, bytes, sum, epoch FROM `+s.table("runs")+` WHERE step = $1 ORDER BY id`, step)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []runInfo
	for rows.Next() {
		r := runInfo{step: step}
		var sum, epoch int64
		if err := rows.Scan(&r.id, &r.entries, &r.chunks, &r.bytes, &sum, &epoch); err != nil {
			return nil, err
		}
		r.sum, r.epoch = uint64(sum), uint64(epoch)
		out = append(out, r)
	}
	return out, rows.Err()
}

// readStepSum returns the step_sums row of step (zero if it has none) and the epoch of the
// commit that wrote it.
func (s *Store) readStepSum(ctx context.Context, tx pgx.Tx, step string) (stepSum, uint64, error) {
	var n, sum, epoch int64
	err := tx.QueryRow(ctx, `SELECT entries, sum, epoch FROM `+s.table("step_sums")+` WHERE step = $1`, step).Scan(&n, &sum, &epoch)
	if errors.Is(err, pgx.ErrNoRows) {
		return stepSum{}, 0, nil
	}
	return stepSum{n, uint64(sum)}, uint64(epoch), err
}

// checkStep compares the runs of step with its step_sums row and every run's chunk count
// with its chunks' rows: a difference is damage.
func (s *Store) checkStep(ctx context.Context, tx pgx.Tx, step string, runs []runInfo) error {
	recorded, epoch, err := s.readStepSum(ctx, tx, step)
	if err != nil {
		return err
	}
	if found := totals(runs); found != recorded {
		if found.entries != recorded.entries {
			return s.damaged(fmt.Sprintf("step %q has %d snapshots in its runs, its commits (the last of epoch %d) recorded %d",
				step, found.entries, epoch, recorded.entries))
		}
		return s.damaged(fmt.Sprintf("step %q has the %d snapshots its commits (the last of epoch %d) recorded, but their checksum differs: a run was changed",
			step, found.entries, epoch))
	}
	if len(runs) == 0 {
		return nil
	}
	ids := make([]int64, len(runs))
	for i, r := range runs {
		ids[i] = r.id
	}
	rows, err := tx.Query(ctx, `SELECT run, count(*) FROM `+s.table("chunks")+` WHERE run = ANY($1) GROUP BY run`, ids)
	if err != nil {
		return err
	}
	counts := map[int64]int{}
	var id int64
	var n int
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { counts[id] = n; return nil }); err != nil {
		return err
	}
	for _, r := range runs {
		if counts[r.id] != r.chunks {
			return s.damaged(fmt.Sprintf("step %q: run %d (of the commit of epoch %d) has %d chunks, its commit recorded %d",
				step, r.id, r.epoch, counts[r.id], r.chunks))
		}
	}
	return nil
}

// copyBatch is how many chunks a run's writer sends in one COPY.
const copyBatch = 16

// runWriter writes a run's chunks as entries come, in run order, inside the commit's
// transaction; finish writes its runs row.
type runWriter struct {
	s       *Store
	ctx     context.Context
	tx      pgx.Tx
	info    runInfo
	enc     runfmt.Encoder
	pending [][]any // chunk rows not yet sent
}

func (s *Store) newRunWriter(ctx context.Context, tx pgx.Tx, step string, id int64, epoch uint64) *runWriter {
	return &runWriter{s: s, ctx: ctx, tx: tx, info: runInfo{id: id, step: step, epoch: epoch}}
}

// add appends e to the run.
func (w *runWriter) add(e *item) error {
	w.info.entries++
	w.enc.Add(e)
	if len(w.enc.Buf) >= chunkTarget {
		return w.closeChunk()
	}
	return nil
}

// closeChunk ends the chunk being built, if it holds entries, and sends the pending chunks
// once there are copyBatch of them.
func (w *runWriter) closeChunk() error {
	if w.enc.Entries == 0 {
		return nil
	}
	data := slices.Clone(w.enc.Buf)
	seq := w.info.chunks
	crc := runfmt.ChunkCRC(w.info.id, seq, data)
	w.pending = append(w.pending, []any{w.info.id, int32(seq), int32(w.enc.Entries), int64(crc), data})
	w.info.chunks++
	w.info.sum += uint64(crc)
	w.info.bytes += int64(len(data))
	w.enc.Reset()
	if len(w.pending) >= copyBatch {
		return w.send()
	}
	return nil
}

// send writes the pending chunks with COPY.
func (w *runWriter) send() error {
	if len(w.pending) == 0 {
		return nil
	}
	_, err := w.tx.CopyFrom(w.ctx, pgx.Identifier{w.s.schema, "chunks"}, []string{"run", "seq", "entries", "crc", "data"},
		pgx.CopyFromRows(w.pending))
	if err != nil {
		return fmt.Errorf("step %q: writing chunks of run %d: %w", w.info.step, w.info.id, err)
	}
	clear(w.pending)
	w.pending = w.pending[:0]
	return nil
}

// finish writes the last chunks and the run's row; it returns false if the run is empty
// (nothing was written).
func (w *runWriter) finish() (runInfo, bool, error) {
	if err := w.closeChunk(); err != nil {
		return runInfo{}, false, err
	}
	if err := w.send(); err != nil {
		return runInfo{}, false, err
	}
	if w.info.entries == 0 {
		return runInfo{}, false, nil
	}
	r := w.info
	if _, err := w.tx.Exec(w.ctx, `INSERT INTO `+w.s.table("runs")+` (id, step, entries, chunks, bytes, sum, epoch) VALUES ($1, $2, $3, $4, $5, $6, $7)`,
		r.id, r.step, r.entries, r.chunks, r.bytes, int64(r.sum), int64(r.epoch)); err != nil {
		return runInfo{}, false, fmt.Errorf("step %q: writing run %d: %w", r.step, r.id, err)
	}
	return r, true, nil
}

// readBatch is how many chunks a run's cursor reads at once: its memory is about readBatch
// times chunkTarget.
const readBatch = 4

// runCursor reads a run's entries in order, a few chunks at a time (so that a merge holds a
// few chunks per run, never a step). If verify, it checks each chunk's checksum, position and
// entry count, the entries' order, and at the run's end its entry count and checksum sum
// against the run's row.
type runCursor struct {
	s      *Store
	ctx    context.Context
	tx     pgx.Tx
	run    runInfo
	verify bool

	seq     int              // the next chunk to fetch
	chunks  []item           // the decoded entries of the fetched chunks
	spans   []runfmt.KeySpan // runfmt.DecodeChunk's scratch
	pos     int
	entries int64
	sum     uint64
	prev    item
	done    bool
}

func (s *Store) newRunCursor(ctx context.Context, tx pgx.Tx, r runInfo, verify bool) *runCursor {
	return &runCursor{s: s, ctx: ctx, tx: tx, run: r, verify: verify}
}

// Damaged is the error of damage found in the cursor's run.
func (c *runCursor) Damaged(format string, args ...any) error {
	return c.s.damaged(fmt.Sprintf("step %q: run %d (of the commit of epoch %d): ", c.run.step, c.run.id, c.run.epoch) + fmt.Sprintf(format, args...))
}

// Next returns the run's Next entry (valid until the Next call), or nil after the last.
func (c *runCursor) Next() (*item, error) {
	for c.pos == len(c.chunks) {
		if c.done {
			return nil, nil
		}
		if err := c.fetch(); err != nil {
			return nil, err
		}
	}
	e := &c.chunks[c.pos]
	c.pos++
	if c.verify {
		if c.entries > 0 && c.prev.Compare(e) >= 0 {
			return nil, c.Damaged("entry %q epoch %d follows %q epoch %d", e.Key, e.Epoch, c.prev.Key, c.prev.Epoch)
		}
		c.prev.Key, c.prev.Epoch = e.Key, e.Epoch
	}
	c.entries++
	return e, nil
}

// fetch reads and decodes the next chunks; after the last, it checks the run's totals.
func (c *runCursor) fetch() error {
	c.chunks, c.pos = c.chunks[:0], 0
	if c.seq >= c.run.chunks {
		c.done = true
		if c.verify && (c.entries != c.run.entries || c.sum != c.run.sum) {
			return c.Damaged("its chunks hold %d entries, checksum sum %d; its commit recorded %d entries, sum %d",
				c.entries, c.sum, c.run.entries, c.run.sum)
		}
		return nil
	}
	rows, err := c.tx.Query(c.ctx, `SELECT seq, entries, crc, data FROM `+c.s.table("chunks")+` WHERE run = $1 AND seq >= $2 ORDER BY seq LIMIT $3`,
		c.run.id, c.seq, min(readBatch, c.run.chunks-c.seq))
	if err != nil {
		return err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var seq, entries int
		var crc int64
		var data []byte
		if err := rows.Scan(&seq, &entries, &crc, &data); err != nil {
			return err
		}
		if seq != c.seq {
			return c.Damaged("chunk %d is missing", c.seq)
		}
		before := len(c.chunks)
		if c.chunks, err = runfmt.DecodeChunk(data, c.chunks, &c.spans); err != nil && c.verify {
			return c.Damaged("chunk %d: %v", seq, err)
		} else if err != nil {
			return fmt.Errorf("step %q: run %d: chunk %d: %w", c.run.step, c.run.id, seq, err)
		}
		if c.verify {
			if got := runfmt.ChunkCRC(c.run.id, seq, data); uint32(crc) != got || crc>>32 != 0 {
				return c.Damaged("chunk %d has checksum %08x, its row records %08x", seq, got, crc)
			}
			if got := len(c.chunks) - before; got != entries {
				return c.Damaged("chunk %d holds %d entries, its row records %d", seq, got, entries)
			}
		}
		c.sum += uint64(uint32(crc))
		c.seq++
		n++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if n == 0 {
		return c.Damaged("chunk %d is missing", c.seq)
	}
	return nil
}
