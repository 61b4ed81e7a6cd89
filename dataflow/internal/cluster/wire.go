package cluster

import (
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/grpc/mem"
)

// A frame is one gRPC message: the execution number (8 bytes, little endian), then messages
// back to back. A message is its kind (one byte) and its fields as unsigned varints; a payload
// or a text is a varint length and its bytes.
const (
	kindHello     byte = iota + 1 // workers, resume (process 0's, else empty): the server's first frame; the frame tells the execution
	kindData                      // edge, from, to, marker kind, epoch, payload
	kindAck                       // edge, from, to, count
	kindReport                    // worker, frontier, done, pack (encoded snapshots, may be empty)
	kindCommit                    // epoch, final
	kindStop                      // (none)
	kindBye                       // (none): the sender finished; its stream ends next
	kindAbort                     // text: the sender's run failed
	kindHeartbeat                 // (none)
)

const frameHeader = 8

// frame is what the gRPC codec carries.
type frame struct{ b []byte }

// codec is the gRPC codec of frames: the bytes as they are.
type codec struct{}

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(*frame)
	if !ok {
		return nil, fmt.Errorf("cluster codec: cannot marshal %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(f.b)}, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error {
	f, ok := v.(*frame)
	if !ok {
		return fmt.Errorf("cluster codec: cannot unmarshal into %T", v)
	}
	f.b = data.Materialize()
	return nil
}

func (codec) Name() string { return "epochflow-frame" }

func appendUvarints(b []byte, kind byte, vs ...uint64) []byte {
	b = append(b, kind)
	for _, v := range vs {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

func appendBytes(b []byte, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

// reader reads the fields of messages; the first error sticks.
type reader struct {
	b   []byte
	err error
}

var errShort = errors.New("truncated message")

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errShort
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *reader) int() int {
	v := r.uvarint()
	if v > 1<<31 {
		r.err = fmt.Errorf("number %d out of range", v)
		return 0
	}
	return int(v)
}

func (r *reader) bytes() []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(len(r.b)) {
		r.err = errShort
		return nil
	}
	p := r.b[:n:n]
	r.b = r.b[n:]
	return p
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.err = errShort
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}
