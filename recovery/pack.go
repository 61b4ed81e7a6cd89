package recovery

import (
	"encoding/binary"
	"errors"
	"fmt"
	"iter"
	"unsafe"
)

// Pack is a list of snapshots encoded back to back in one byte slice: the form in which the
// engine hands a worker's snapshots of an epoch to Commit (Epoch.Packs). A snapshot of a short
// key with a counter for its state takes some 15 bytes in a Pack, against a Snapshot value's
// 72 bytes (plus its state's own allocation), and a Pack holds no pointers for the garbage
// collector to scan: with a million keys changed an epoch, that is the difference between a
// recovery store costing twice the flow's memory or not.
//
// Each snapshot is encoded as (uvarints as in encoding/binary): the index of its step in the
// pack's table of steps, the key's length and bytes, the epoch, and 0 for a tombstone or 1 +
// the state's length and the state's bytes.
//
// The zero Pack is empty and ready to use. A Pack is not safe for concurrent use.
type Pack struct {
	buf   []byte
	steps []string // the steps of its snapshots, by index
	last  int      // the index of the step of the last Add: a step saves its snapshots together
	n     int      // the number of snapshots
	lo    uint64   // the least epoch of a snapshot (0 when empty)
	hi    uint64   // the greatest
}

// Add appends a snapshot of step's key at the end of epoch: its state, or a tombstone when
// deleted (state is then ignored). It copies key and state: the caller may reuse them.
func (p *Pack) Add(step, key string, epoch uint64, state []byte, deleted bool) {
	s := p.stepIndex(step)
	p.buf = binary.AppendUvarint(p.buf, uint64(s))
	p.buf = binary.AppendUvarint(p.buf, uint64(len(key)))
	p.buf = append(p.buf, key...)
	p.buf = binary.AppendUvarint(p.buf, epoch)
	if deleted {
		p.buf = append(p.buf, 0)
	} else {
		p.buf = binary.AppendUvarint(p.buf, uint64(len(state))+1)
		p.buf = append(p.buf, state...)
	}
	if p.n == 0 {
		p.lo, p.hi = epoch, epoch
	} else {
		p.lo, p.hi = min(p.lo, epoch), max(p.hi, epoch)
	}
	p.n++
}

// AddSnapshot appends s (see Add).
func (p *Pack) AddSnapshot(s *Snapshot) { p.Add(s.Step, s.Key, s.Epoch, s.State, s.Deleted) }

func (p *Pack) stepIndex(step string) int {
	if p.last < len(p.steps) && p.steps[p.last] == step {
		return p.last
	}
	for i, s := range p.steps {
		if s == step {
			p.last = i
			return i
		}
	}
	p.steps = append(p.steps, step)
	p.last = len(p.steps) - 1
	return p.last
}

// Len is the number of snapshots in the pack.
func (p *Pack) Len() int { return p.n }

// Size is the number of bytes the pack's snapshots take.
func (p *Pack) Size() int { return len(p.buf) }

// Cap is the number of bytes of snapshots the pack has room for before it grows.
func (p *Pack) Cap() int { return cap(p.buf) }

// Epochs returns the least and the greatest epoch of the pack's snapshots (0, 0 when empty).
func (p *Pack) Epochs() (lo, hi uint64) { return p.lo, p.hi }

// Grow makes room for n more bytes of snapshots, so that the Adds that fill them do not copy
// the pack's bytes again.
func (p *Pack) Grow(n int) {
	if n > cap(p.buf)-len(p.buf) {
		b := make([]byte, len(p.buf), len(p.buf)+n)
		copy(b, p.buf)
		p.buf = b
	}
}

// Reset empties the pack, keeping its memory for the snapshots added next. The keys and states
// that All yielded before are overwritten by them.
func (p *Pack) Reset() {
	p.buf = p.buf[:0]
	p.steps = p.steps[:0]
	p.last, p.n, p.lo, p.hi = 0, 0, 0, 0
}

// All visits the pack's snapshots in the order they were added. The Snapshot it yields is
// valid until the next one; its Key and State point into the pack's memory (no copy): they
// stay valid until the pack is Reset, and must not be modified.
func (p *Pack) All() iter.Seq[*Snapshot] {
	return func(yield func(*Snapshot) bool) {
		var s Snapshot
		for off := 0; off < len(p.buf); {
			var r packed
			off = p.decode(off, &r)
			s = Snapshot{Step: p.steps[r.step], Key: r.key, Epoch: r.epoch, State: r.state, Deleted: r.dead}
			if !yield(&s) {
				return
			}
		}
	}
}

// packed is a snapshot decoded from a pack: its key and state point into the pack.
type packed struct {
	step  int
	key   string
	epoch uint64
	state []byte // nil for a tombstone; never nil otherwise
	dead  bool
}

// decode decodes the snapshot at off into r and returns the offset of the next. The pack
// encoded it itself: a malformed pack is a bug, and panics (an index out of range).
func (p *Pack) decode(off int, r *packed) int {
	s, n := binary.Uvarint(p.buf[off:])
	off += n
	kl, n := binary.Uvarint(p.buf[off:])
	off += n
	r.step = int(s)
	r.key = ""
	if kl > 0 {
		r.key = unsafe.String(&p.buf[off], int(kl))
	}
	off += int(kl)
	r.epoch, n = binary.Uvarint(p.buf[off:])
	off += n
	sl, n := binary.Uvarint(p.buf[off:])
	off += n
	if sl == 0 {
		r.state, r.dead = nil, true
		return off
	}
	end := off + int(sl) - 1
	r.state, r.dead = p.buf[off:end:end], false
	return end
}

// keyAt returns the key of the snapshot at off, without decoding the rest.
func (p *Pack) keyAt(off int) (step int, key string) {
	s, n := binary.Uvarint(p.buf[off:])
	off += n
	kl, n := binary.Uvarint(p.buf[off:])
	off += n
	if kl == 0 {
		return int(s), ""
	}
	return int(s), unsafe.String(&p.buf[off], int(kl))
}

// AppendBinary appends the pack's encoding to b (encoding.BinaryAppender): its table of steps
// and its snapshots as they are, so that a pack can travel to another process (a worker of a
// cluster sends its packs to the process that writes the store) and be rebuilt there with
// UnmarshalBinary.
func (p *Pack) AppendBinary(b []byte) ([]byte, error) {
	b = binary.AppendUvarint(b, uint64(len(p.steps)))
	for _, s := range p.steps {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	b = binary.AppendUvarint(b, uint64(len(p.buf)))
	return append(b, p.buf...), nil
}

// errPack is the error of a malformed encoded pack.
var errPack = errors.New("malformed pack")

// UnmarshalBinary replaces the pack's snapshots with those of data, which AppendBinary wrote
// (encoding.BinaryUnmarshaler). It checks every snapshot, so that a malformed encoding is an
// error (wrapping nothing of the caller's) and never a panic later; the pack copies what it
// keeps of data.
func (p *Pack) UnmarshalBinary(data []byte) error {
	p.Reset()
	r := data
	uv := func() (uint64, error) {
		v, n := binary.Uvarint(r)
		if n <= 0 {
			return 0, errPack
		}
		r = r[n:]
		return v, nil
	}
	take := func() ([]byte, error) {
		n, err := uv()
		if err != nil || n > uint64(len(r)) {
			return nil, errPack
		}
		v := r[:n]
		r = r[n:]
		return v, nil
	}
	ns, err := uv()
	if err != nil || ns > uint64(len(r)) {
		return fmt.Errorf("%w: its table of steps", errPack)
	}
	for range ns {
		s, err := take()
		if err != nil {
			return fmt.Errorf("%w: its table of steps", errPack)
		}
		p.steps = append(p.steps, string(s))
	}
	buf, err := take()
	if err != nil || len(r) != 0 {
		return fmt.Errorf("%w: its snapshots' length", errPack)
	}
	// Check every snapshot before decode may read it.
	for off := 0; off < len(buf); {
		next, epoch, err := checkPacked(buf[off:], len(p.steps))
		if err != nil {
			p.Reset()
			return fmt.Errorf("%w: snapshot %d", err, p.n+1)
		}
		off += next
		if p.n == 0 {
			p.lo, p.hi = epoch, epoch
		} else {
			p.lo, p.hi = min(p.lo, epoch), max(p.hi, epoch)
		}
		p.n++
	}
	p.buf = append(p.buf[:0], buf...)
	return nil
}

// checkPacked checks the encoding of the snapshot at the start of b and returns its length
// and epoch.
func checkPacked(b []byte, steps int) (int, uint64, error) {
	off := 0
	uv := func() (uint64, bool) {
		v, n := binary.Uvarint(b[off:])
		if n <= 0 {
			return 0, false
		}
		off += n
		return v, true
	}
	s, ok := uv()
	if !ok || s >= uint64(steps) {
		return 0, 0, errPack
	}
	kl, ok := uv()
	if !ok || kl > uint64(len(b)-off) {
		return 0, 0, errPack
	}
	off += int(kl)
	epoch, ok := uv()
	if !ok {
		return 0, 0, errPack
	}
	sl, ok := uv()
	if !ok || (sl > 0 && sl-1 > uint64(len(b)-off)) {
		return 0, 0, errPack
	}
	if sl > 0 {
		off += int(sl - 1)
	}
	return off, epoch, nil
}
