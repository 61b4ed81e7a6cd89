package recovery

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"unsafe"
)

// How a SQLiteStore finds out that its file is damaged (see ErrDamaged):
//
//   - At open, a check of the SQLite header's fixed fields and SQLite's quick check of the
//     whole file, before anything is written: it reads the structure of every page (the
//     B-trees, the overflow chains that hold the chunks' blobs, the list of free pages) but
//     not the chunks' contents (about a millisecond on a store of 300,000 keys, 2.5 MB). It finds
//     the damage that no chunk shows: a damaged list of free pages, which the next commit
//     would allocate from over live pages, or pages that belong to no table or to two. A
//     read-only open (recovery inspect) checks every table but chunks, and Verify then the
//     whole file, so that inspect can show what a damaged store holds.
//   - At each commit, every chunk row records its entry count and the CRC-32C of its blob,
//     run id and position (runfmt.ChunkCRC); every run row its entry and chunk counts and the sum
//     of its chunks' checksums; the step_sums table, per step, the entry count and checksum
//     sum over its runs, all written in the commit's transaction. A commit checks that a
//     step's runs add up to its step_sums entry before it adds a run, and its compaction
//     verifies every chunk it merges, so that damage is never rewritten into a run whose
//     checksums would bless it.
//   - Load reads every chunk of its step (it does anyway, to merge the runs), checks each
//     chunk's checksum and entry count, the entries' order, each run's chunk and entry
//     counts and checksum sum, and the step's totals against step_sums, in one read
//     transaction; StepIDs compares the steps of step_sums with those of the runs. A chunk
//     or run lost, added, moved or changed by damage (or by an edit behind the store's back,
//     which no SQLite check can see) makes them differ, and SQLite's own reports of a
//     corrupt page on the way are errors wrapping ErrDamaged too.
//
// With a row per snapshot (schema version 2), the quick check of the whole file read every
// row and took 0.26 to 0.43 s for a million keys, 8 to 13 % of BenchmarkResume1MKeys, so a
// resume skipped it; with runs of chunks it reads a few thousand pages for a million keys.
// BenchmarkVerification (and dataflow's BenchmarkResume1MKeysVerification) measure what the
// verification as a whole costs a resume: the same resume with and without it, alternated.

// rowHash is the hash of a snapshot row that step_sums of schema version 2 added up (the
// migration to version 3 checks the rows with it): a multiply-xorshift hash of
// the row's fields, each length-prefixed, with a final mixer. Changing one byte of a row
// changes its hash (every step is a bijection); another change does but with a chance of
// 2^-64. It is stable across processes and releases (TestRowHash).
func rowHash(step, key string, epoch uint64, state []byte, dead bool) uint64 {
	h := uint64(0x6a09e667f3bcc908)
	h = hashString(h, step)
	h = hashString(h, key)
	h = hashWord(h, epoch)
	if dead {
		h = hashWord(h, math64)
	} else {
		h = hashBytes(h, state)
	}
	// The finalizer of splitmix64.
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return h
}

// math64 stands for a tombstone's state in rowHash: no state's length is 2^64-1.
const math64 = ^uint64(0)

// hashWord mixes w into h. For a given h it is a bijection of w, and for a given w one of h:
// two inputs that differ in one word hash differently.
func hashWord(h, w uint64) uint64 {
	h = (h ^ w) * 0x9e3779b97f4a7c15
	return h ^ h>>29
}

// hashString mixes the length of s, then s eight bytes at a time (little-endian, the last
// word zero-padded), into h.
func hashString(h uint64, s string) uint64 {
	return hashBytes(h, unsafe.Slice(unsafe.StringData(s), len(s))) // read, never written
}

// hashBytes is hashString of a byte slice.
func hashBytes(h uint64, b []byte) uint64 {
	h = hashWord(h, uint64(len(b)))
	for len(b) >= 8 {
		h = hashWord(h, binary.LittleEndian.Uint64(b))
		b = b[8:]
	}
	if len(b) > 0 {
		var tail [8]byte
		copy(tail[:], b)
		h = hashWord(h, binary.LittleEndian.Uint64(tail[:]))
	}
	return h
}

// stepSum is a step's entry of step_sums, or the totals of runs: an entry count and a
// checksum sum.
type stepSum struct {
	rows int64
	sum  uint64
}

func (s *stepSum) add(h uint64) { s.rows++; s.sum += h }

// whatToDo ends every ErrDamaged error: the two ways out.
func whatToDo(path string) string {
	return fmt.Sprintf("restore a backup of the directory %s (a copy taken while no flow had it open), or start over with a new recovery directory, which replays the flow from its sources",
		filepath.Dir(path))
}

// damaged returns an error wrapping ErrDamaged that names the store's file, says what is
// wrong (why, which names the step where the damage is attributable to one) and what to do.
func damaged(path, why string) error {
	return fmt.Errorf("%w: %s: %s; the flow cannot resume from it: %s", ErrDamaged, path, why, whatToDo(path))
}

// quickCheckRows is how many of quick_check's messages an error quotes.
const quickCheckRows = 5

// treeRe finds the pages that a quick_check message is about ("Tree 7 page 9 cell 0: ...",
// "On tree page 7 cell 0: ...", "Page 7: ..."); those that are a table's root page name it.
var treeRe = regexp.MustCompile(`(?:Tree|[Pp]age) (\d+)`)

// quickCheck runs SQLite's PRAGMA quick_check on the whole file (table "") or on one table,
// and returns nil if it reports ok, or an error wrapping ErrDamaged that quotes its first
// messages and names the tables they are about.
func quickCheck(ctx context.Context, q querier, path, table string) error {
	pragma := "PRAGMA quick_check(" + strconv.Itoa(quickCheckRows) + ")"
	if table != "" {
		pragma = "PRAGMA quick_check(" + table + ")"
	}
	rows, err := q.QueryContext(ctx, pragma)
	if err != nil {
		return checkError(path, err)
	}
	var msgs []string
	for rows.Next() {
		var m string
		if err := rows.Scan(&m); err != nil {
			rows.Close()
			return checkError(path, err)
		}
		for _, line := range strings.Split(m, "\n") {
			if line != "" && !strings.HasPrefix(line, "*** in database") && len(msgs) < quickCheckRows {
				msgs = append(msgs, line)
			}
		}
	}
	if err := rows.Close(); err != nil {
		return checkError(path, err)
	}
	if err := rows.Err(); err != nil {
		return checkError(path, err)
	}
	if len(msgs) == 1 && msgs[0] == "ok" {
		return nil
	}
	if len(msgs) == 0 {
		return damaged(path, "SQLite's quick check returned nothing")
	}
	return damaged(path, "SQLite's quick check found "+strings.Join(msgs, "; ")+treeNames(ctx, q, msgs))
}

// treeNames names the tables and indexes whose root pages the quick check messages mention,
// as " (in table snapshots)"; "" if it cannot tell.
func treeNames(ctx context.Context, q querier, msgs []string) string {
	var names []string
	for _, m := range msgs {
		for _, sub := range treeRe.FindAllStringSubmatch(m, -1) {
			var name string
			if err := q.QueryRowContext(ctx, `SELECT name FROM sqlite_schema WHERE rootpage = ?`, sub[1]).Scan(&name); err == nil && !contains(names, name) {
				names = append(names, name)
			}
		}
	}
	if len(names) == 0 {
		return ""
	}
	return " (in " + strings.Join(names, ", ") + ")"
}

func contains(s []string, x string) bool {
	for _, y := range s {
		if y == x {
			return true
		}
	}
	return false
}

// checkError explains an error that stopped a quick check: SQLite's own corruption errors
// are damage.
func checkError(path string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("recovery store %s: checking the file: %w", path, err)
	}
	if isCorrupt(err) {
		return damaged(path, fmt.Sprintf("SQLite's quick check failed: %v", err))
	}
	return fmt.Errorf("recovery store %s: checking the file: %w", path, err)
}

// stepDamaged is the error of a step whose runs differ from what its commits recorded.
func stepDamaged(path, step string, epoch int64, recorded, found stepSum) error {
	var why string
	switch {
	case recorded.rows != found.rows:
		why = fmt.Sprintf("step %q has %d snapshots in its runs, its commits (the last of epoch %d) recorded %d", step, found.rows, epoch, recorded.rows)
	default:
		why = fmt.Sprintf("step %q has the %d snapshots its commits (the last of epoch %d) recorded, but their checksum differs: a run was changed", step, found.rows, epoch)
	}
	if epoch == 0 {
		why = strings.Replace(why, " (the last of epoch 0)", "", 1)
	}
	return damaged(path, why)
}

// sqliteMagic starts every SQLite database file.
const sqliteMagic = "SQLite format 3\x00"

// checkHeader reads the 100-byte header of the SQLite file at path and returns an error
// wrapping ErrDamaged if fields that SQLite trusts hold values it never writes (SQLite itself
// reads some of them as "open read-only" or "unsupported file format" instead of as damage). It returns nil for a file too short to have a header, or
// one without SQLite's magic string, which SQLite refuses itself (ErrNotStore).
func checkHeader(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("recovery store %s: %w", path, err)
	}
	defer f.Close()
	var h [100]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return nil
		}
		return fmt.Errorf("recovery store %s: %w", path, err)
	}
	if string(h[:16]) != sqliteMagic {
		return nil
	}
	pageSize := int(binary.BigEndian.Uint16(h[16:18]))
	if pageSize == 1 {
		pageSize = 65536
	}
	var bad []string
	if pageSize < 512 || pageSize&(pageSize-1) != 0 {
		bad = append(bad, fmt.Sprintf("page size %d", pageSize))
	}
	if h[18] < 1 || h[18] > 2 || h[19] < 1 || h[19] > 2 {
		bad = append(bad, fmt.Sprintf("file format versions %d and %d", h[18], h[19]))
	}
	if h[21] != 64 || h[22] != 32 || h[23] != 32 {
		bad = append(bad, fmt.Sprintf("payload fractions %d, %d, %d", h[21], h[22], h[23]))
	}
	if v := binary.BigEndian.Uint32(h[44:48]); v > 4 {
		bad = append(bad, fmt.Sprintf("schema format %d", v))
	}
	if v := binary.BigEndian.Uint32(h[56:60]); v > 3 {
		bad = append(bad, fmt.Sprintf("text encoding %d", v))
	}
	// The store never enables auto-vacuum, whose fields SQLite would trust.
	if v, w := binary.BigEndian.Uint32(h[52:56]), binary.BigEndian.Uint32(h[64:68]); v != 0 || w != 0 {
		bad = append(bad, fmt.Sprintf("auto-vacuum fields %d and %d", v, w))
	}
	for _, b := range h[72:92] {
		if b != 0 {
			bad = append(bad, "non-zero reserved bytes")
			break
		}
	}
	if len(bad) > 0 {
		return damaged(path, "its SQLite header has "+strings.Join(bad, ", ")+", which SQLite never writes")
	}
	return nil
}
