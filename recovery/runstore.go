package recovery

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"

	"github.com/epochflow/epochflow/recovery/internal/runfmt"
)

// How runs (runs.go) live in the SQLite file: a row of table runs per run, the run's chunks as
// rows of table chunks (see schemaV3).

// runInfo is a row of table runs.
type runInfo struct {
	id      int64
	step    string
	lo, hi  uint64 // the oldest and newest epoch of its entries
	entries int64
	chunks  int
	bytes   int64  // the size of its chunks' blobs
	sum     uint64 // the sum of its chunks' checksums (runfmt.ChunkCRC)
}

// readRuns returns the runs of step, oldest first (their epoch ranges do not overlap: a
// commit's run holds epochs after every earlier run's, and compaction merges neighbours).
func readRuns(ctx context.Context, q querier, step string) ([]runInfo, error) {
	rows, err := q.QueryContext(ctx, `SELECT id, lo, hi, entries, chunks, bytes, sum FROM runs WHERE step = ? ORDER BY hi`, step)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []runInfo
	for rows.Next() {
		r := runInfo{step: step}
		var lo, hi, sum int64
		if err := rows.Scan(&r.id, &lo, &hi, &r.entries, &r.chunks, &r.bytes, &sum); err != nil {
			return nil, err
		}
		r.lo, r.hi, r.sum = uint64(lo), uint64(hi), uint64(sum)
		out = append(out, r)
	}
	return out, rows.Err()
}

// totals is the stepSum of runs.
func totals(runs []runInfo) stepSum {
	var t stepSum
	for _, r := range runs {
		t.rows += r.entries
		t.sum += r.sum
	}
	return t
}

// readStepSum reads the step_sums entry of step (zero if it has none) and its epoch.
func readStepSum(ctx context.Context, q querier, step string) (stepSum, int64, error) {
	var n, sum, epoch int64
	err := q.QueryRowContext(ctx, `SELECT rows, sum, epoch FROM step_sums WHERE step = ?`, step).Scan(&n, &sum, &epoch)
	if errors.Is(err, sql.ErrNoRows) {
		return stepSum{}, 0, nil
	}
	return stepSum{n, uint64(sum)}, epoch, err
}

// runWriter writes a run's chunks as entries come, in run order, inside a transaction; finish
// writes its runs row.
type runWriter struct {
	ctx  context.Context
	tx   *sql.Tx
	ins  *sql.Stmt // INSERT INTO chunks
	info runInfo
	enc  runfmt.Encoder
}

// newRunWriter starts run id of step; ins is a prepared INSERT INTO chunks of the
// transaction tx.
func newRunWriter(ctx context.Context, tx *sql.Tx, ins *sql.Stmt, step string, id int64) *runWriter {
	return &runWriter{ctx: ctx, tx: tx, ins: ins, info: runInfo{id: id, step: step}}
}

// add appends e to the run.
func (w *runWriter) add(e *item) error {
	if w.info.entries == 0 {
		w.info.lo, w.info.hi = e.Epoch, e.Epoch
	}
	w.info.lo, w.info.hi = min(w.info.lo, e.Epoch), max(w.info.hi, e.Epoch)
	w.info.entries++
	w.enc.Add(e)
	if len(w.enc.Buf) >= chunkTarget {
		return w.flush()
	}
	return nil
}

// flush writes the chunk being built, if it holds entries.
func (w *runWriter) flush() error {
	if w.enc.Entries == 0 {
		return nil
	}
	if err := w.write(w.enc.Buf, w.enc.Entries); err != nil {
		return err
	}
	w.info.bytes += int64(len(w.enc.Buf))
	w.enc.Reset()
	return nil
}

// write inserts the next chunk of the run.
func (w *runWriter) write(data []byte, entries int) error {
	seq := w.info.chunks
	crc := runfmt.ChunkCRC(w.info.id, seq, data)
	if _, err := w.ins.ExecContext(w.ctx, w.info.id, seq, entries, int64(crc), data); err != nil {
		return fmt.Errorf("step %q: writing chunk %d of run %d: %w", w.info.step, seq, w.info.id, err)
	}
	w.info.chunks++
	w.info.sum += uint64(crc)
	return nil
}

// finish writes the last chunk and the run's row, and returns the run; a run without entries
// writes nothing and returns false.
func (w *runWriter) finish() (runInfo, bool, error) {
	if err := w.flush(); err != nil {
		return runInfo{}, false, err
	}
	if w.info.entries == 0 {
		return runInfo{}, false, nil
	}
	r := w.info
	if _, err := w.tx.ExecContext(w.ctx, `INSERT INTO runs (id, step, lo, hi, entries, chunks, bytes, sum) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		r.id, r.step, int64(r.lo), int64(r.hi), r.entries, r.chunks, r.bytes, int64(r.sum)); err != nil {
		return runInfo{}, false, fmt.Errorf("step %q: writing run %d: %w", r.step, r.id, err)
	}
	return r, true, nil
}

// deleteRun deletes the row of run r and whatever chunks of it are left.
func deleteRun(ctx context.Context, tx *sql.Tx, r runInfo) error {
	if _, err := tx.ExecContext(ctx, `DELETE FROM chunks WHERE run = ?`, r.id); err != nil {
		return fmt.Errorf("step %q: deleting the chunks of run %d: %w", r.step, r.id, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM runs WHERE id = ?`, r.id); err != nil {
		return fmt.Errorf("step %q: deleting run %d: %w", r.step, r.id, err)
	}
	return nil
}

// chunkGetter reads chunk seq of run: its entry count, checksum and blob (a copy the caller
// owns). found is false if there is no such chunk.
type chunkGetter func(run int64, seq int) (entries int, crc uint32, data []byte, found bool, err error)

// stmtGetter is a chunkGetter over a prepared SELECT of a chunk.
func stmtGetter(ctx context.Context, st *sql.Stmt) chunkGetter {
	return func(run int64, seq int) (int, uint32, []byte, bool, error) {
		var entries int
		var crc int64
		var data []byte
		err := st.QueryRowContext(ctx, run, seq).Scan(&entries, &crc, &data)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, 0, nil, false, nil
		}
		if err != nil {
			return 0, 0, nil, false, err
		}
		if data == nil {
			data = []byte{}
		}
		return entries, uint32(crc), data, true, nil
	}
}

// selectChunkSQL reads one chunk for a chunkGetter.
const selectChunkSQL = `SELECT entries, crc, data FROM chunks WHERE run = ?1 AND seq = ?2`

// runCursor reads a run's entries in order, chunk by chunk, checking what it reads: the
// entries' order and each chunk's entry count, and (if verify) each chunk's checksum and, at
// the end, the run's entry count and the sum of its chunks' checksums. Its errors wrap ErrDamaged, naming the file
// and the step.
type runCursor struct {
	info   runInfo
	get    chunkGetter
	verify bool
	path   string
	done   func(seq int) error // if not nil, called once a chunk is decoded (compaction deletes it)

	seq   int              // the next chunk to read
	buf   []item           // the entries of the chunk being read
	spans []runfmt.KeySpan // runfmt.DecodeChunk's scratch
	pos   int              // the next entry of buf
	found stepSum          // the entries read so far, and the sum of their chunks' checksums
	last  item             // the previous entry, for the order check
	ended bool

	mem   *entries // a cursor over entries in memory (memCursor): what it reads
	memAt int      // the next entry of mem to decode
}

func newRunCursor(info runInfo, get chunkGetter, verify bool, path string) *runCursor {
	return &runCursor{info: info, get: get, verify: verify, path: path}
}

// memCursor is a cursor over entries in memory, in run order: a commit's own, which it
// merges with the step's runs without writing them as a run first.
func memCursor(step string, es *entries, path string) *runCursor {
	return &runCursor{info: runInfo{step: step, hi: math.MaxUint64}, mem: es, path: path}
}

// memBatch is how many entries a cursor over entries in memory decodes at a time.
const memBatch = 256

// loadMem decodes the next entries of c.mem, or ends the cursor.
func (c *runCursor) loadMem() {
	c.buf, c.pos = c.buf[:0], 0
	for c.memAt < c.mem.len() && len(c.buf) < memBatch {
		c.buf = append(c.buf, c.mem.item(c.memAt))
		c.memAt++
	}
	c.ended = c.memAt == c.mem.len()
}

// Damaged is an ErrDamaged error about the cursor's run.
func (c *runCursor) Damaged(format string, args ...any) error {
	return damaged(c.path, fmt.Sprintf("step %q: run %d (epochs %d to %d): ", c.info.step, c.info.id, c.info.lo, c.info.hi)+fmt.Sprintf(format, args...))
}

// Next returns the run's Next entry, or nil at its end (after checking the run's totals).
// The entry stays valid until the call after the Next.
func (c *runCursor) Next() (*item, error) {
	for c.pos == len(c.buf) {
		if c.ended {
			return nil, nil
		}
		if err := c.load(); err != nil {
			return nil, err
		}
	}
	c.pos++
	return &c.buf[c.pos-1], nil
}

// chunk returns the run's entries that next has not returned, up to the end of the chunk
// being read, or nil at the run's end (after checking its totals). They stay valid until
// the next call of chunk or next.
func (c *runCursor) chunk() ([]item, error) {
	for c.pos == len(c.buf) {
		if c.ended {
			return nil, nil
		}
		if err := c.load(); err != nil {
			return nil, err
		}
	}
	es := c.buf[c.pos:]
	c.pos = len(c.buf)
	return es, nil
}

// check checks the order and epochs of the entries of a chunk just decoded.
func (c *runCursor) check(seq int) error {
	for i := range c.buf {
		e := &c.buf[i]
		if c.found.rows > 0 && !c.last.Less(e) {
			return c.Damaged("chunk %d: entries out of order: key %q epoch %d after key %q epoch %d", seq, e.Key, e.Epoch, c.last.Key, c.last.Epoch)
		}
		if e.Epoch < c.info.lo || e.Epoch > c.info.hi {
			return c.Damaged("chunk %d: key %q has epoch %d, outside the run's", seq, e.Key, e.Epoch)
		}
		c.last.Key, c.last.Epoch = e.Key, e.Epoch
		c.found.rows++
	}
	return nil
}

// load reads the next chunk, or ends the run.
func (c *runCursor) load() error {
	if c.mem != nil {
		c.loadMem()
		return nil
	}
	if c.seq == c.info.chunks {
		c.ended = true
		c.buf, c.pos = c.buf[:0], 0
		if c.verify && c.found != (stepSum{c.info.entries, c.info.sum}) {
			if c.found.rows != c.info.entries {
				return c.Damaged("it has %d entries, its commit recorded %d", c.found.rows, c.info.entries)
			}
			return c.Damaged("its %d entries are those its commit recorded, but their checksum differs: an entry was changed", c.found.rows)
		}
		// A chunk after the last would be found by the counts of the step (step_sums).
		return nil
	}
	seq := c.seq
	n, crc, data, ok, err := c.get(c.info.id, seq)
	if err != nil {
		return fmt.Errorf("step %q: reading chunk %d of run %d: %w", c.info.step, seq, c.info.id, err)
	}
	if !ok {
		return c.Damaged("chunk %d of %d is missing", seq, c.info.chunks)
	}
	if c.verify {
		got := runfmt.ChunkCRC(c.info.id, seq, data)
		if got != crc {
			return c.Damaged("chunk %d of %d has checksum %08x, its commit recorded %08x", seq, c.info.chunks, got, crc)
		}
		c.found.sum += uint64(got)
	}
	c.buf, err = runfmt.DecodeChunk(data, c.buf[:0], &c.spans)
	if err != nil {
		return c.Damaged("chunk %d of %d: %v", seq, c.info.chunks, err)
	}
	if len(c.buf) != n || n == 0 {
		return c.Damaged("chunk %d of %d holds %d entries, its commit recorded %d", seq, c.info.chunks, len(c.buf), n)
	}
	if err := c.check(seq); err != nil {
		return err
	}
	c.pos = 0
	c.seq++
	if c.done != nil {
		return c.done(seq)
	}
	return nil
}
