package dataflow

import (
	"encoding"
	"encoding/binary"
	"encoding/json"

	"fmt"
	"math"
	"reflect"
	"strings"
)

// Codec turns a step's state into bytes for the recovery store and back. The key is the state
// key (or partition key) the bytes belong to.
type Codec[S any] interface {
	Encode(state S) ([]byte, error)
	Decode(key string, data []byte) (S, error)
}

// DefaultCodec returns the codec used when a step names none. Integers, floats, bools, strings
// and []byte are stored in a compact binary form; anything else as JSON, which round-trips plain
// structs, slices and maps of such values. CheckCodec reports the types it cannot round-trip.
func DefaultCodec[S any]() Codec[S] {
	var zero S
	switch any(zero).(type) {
	case int, int64, int32, int16, int8, uint, uint64, uint32, uint16, uint8, bool, float64, float32,
		string, []byte, struct{}:
		return binaryCodec[S]{}
	}
	return jsonCodec[S]{}
}

// AppendCodec is a Codec that can also append a state's encoding to a buffer. A stateful step
// whose codec is one encodes the states of an epoch's changed keys into a few shared buffers
// instead of allocating a slice per key (with a million changed keys an epoch, those
// allocations and the garbage collection of them cost more than the encoding). The default
// codecs are AppendCodecs.
type AppendCodec[S any] interface {
	Codec[S]
	// AppendEncode appends the encoding of state to dst (the bytes Encode returns) and
	// returns the extended slice.
	AppendEncode(dst []byte, state S) ([]byte, error)
}

type binaryCodec[S any] struct{}

func (c binaryCodec[S]) Encode(s S) ([]byte, error) {
	b, err := c.AppendEncode(nil, s)
	if b == nil && err == nil {
		b = []byte{}
	}
	return b, err
}

func (binaryCodec[S]) AppendEncode(dst []byte, s S) ([]byte, error) {
	switch v := any(s).(type) {
	case int:
		return binary.AppendVarint(dst, int64(v)), nil
	case int64:
		return binary.AppendVarint(dst, v), nil
	case int32:
		return binary.AppendVarint(dst, int64(v)), nil
	case int16:
		return binary.AppendVarint(dst, int64(v)), nil
	case int8:
		return binary.AppendVarint(dst, int64(v)), nil
	case uint:
		return binary.AppendUvarint(dst, uint64(v)), nil
	case uint64:
		return binary.AppendUvarint(dst, v), nil
	case uint32:
		return binary.AppendUvarint(dst, uint64(v)), nil
	case uint16:
		return binary.AppendUvarint(dst, uint64(v)), nil
	case uint8:
		return append(dst, v), nil
	case bool:
		if v {
			return append(dst, 1), nil
		}
		return append(dst, 0), nil
	case float64:
		return binary.LittleEndian.AppendUint64(dst, math.Float64bits(v)), nil
	case float32:
		return binary.LittleEndian.AppendUint32(dst, math.Float32bits(v)), nil
	case string:
		return append(dst, v...), nil
	case []byte:
		return append(dst, v...), nil
	case struct{}:
		return dst, nil
	}
	return dst, fmt.Errorf("binary codec: unsupported type %T", s)
}

func (binaryCodec[S]) Decode(key string, data []byte) (S, error) {
	var s S
	var v any
	bad := func() (S, error) {
		return s, fmt.Errorf("key %q: cannot decode %d bytes as %T", key, len(data), s)
	}
	varint := func() (int64, bool) {
		n, k := binary.Varint(data)
		return n, k == len(data) && k > 0
	}
	uvarint := func() (uint64, bool) {
		n, k := binary.Uvarint(data)
		return n, k == len(data) && k > 0
	}
	switch any(s).(type) {
	case int, int64, int32, int16, int8:
		n, ok := varint()
		if !ok {
			return bad()
		}
		switch any(s).(type) {
		case int:
			v = int(n)
		case int64:
			v = n
		case int32:
			v = int32(n)
		case int16:
			v = int16(n)
		case int8:
			v = int8(n)
		}
	case uint, uint64, uint32, uint16:
		n, ok := uvarint()
		if !ok {
			return bad()
		}
		switch any(s).(type) {
		case uint:
			v = uint(n)
		case uint64:
			v = n
		case uint32:
			v = uint32(n)
		case uint16:
			v = uint16(n)
		}
	case uint8:
		if len(data) != 1 {
			return bad()
		}
		v = data[0]
	case bool:
		if len(data) != 1 || data[0] > 1 {
			return bad()
		}
		v = data[0] == 1
	case float64:
		if len(data) != 8 {
			return bad()
		}
		v = math.Float64frombits(binary.LittleEndian.Uint64(data))
	case float32:
		if len(data) != 4 {
			return bad()
		}
		v = math.Float32frombits(binary.LittleEndian.Uint32(data))
	case string:
		v = string(data)
	case []byte:
		v = append([]byte{}, data...)
	case struct{}:
		v = struct{}{}
	default:
		return bad()
	}
	return v.(S), nil
}

type jsonCodec[S any] struct{}

func (jsonCodec[S]) Encode(s S) ([]byte, error) { return json.Marshal(s) }

func (jsonCodec[S]) AppendEncode(dst []byte, s S) ([]byte, error) {
	b, err := json.Marshal(s)
	return append(dst, b...), err
}

func (jsonCodec[S]) Decode(key string, data []byte) (S, error) {
	var s S
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("key %q: decoding state: %w", key, err)
	}
	return s, nil
}

// CheckCodec reports why DefaultCodec cannot round-trip S (an unexported struct field, which
// JSON would silently drop; an interface, channel or function), or nil when it can. Types that
// implement json.Marshaler and json.Unmarshaler, or encoding.TextMarshaler and
// TextUnmarshaler, are trusted. The error says what is wrong with S, not which codec to give
// instead: that depends on the step (StatefulLogic.Codec for Stateful, an operator's options).
func CheckCodec[S any]() error {
	return checkType(reflect.TypeFor[S](), nil)
}

var (
	jsonMarshaler   = reflect.TypeFor[json.Marshaler]()
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textMarshaler   = reflect.TypeFor[encoding.TextMarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

func trusted(t reflect.Type) bool {
	p := reflect.PointerTo(t)
	return (t.Implements(jsonMarshaler) || p.Implements(jsonMarshaler)) && p.Implements(jsonUnmarshaler) ||
		(t.Implements(textMarshaler) || p.Implements(textMarshaler)) && p.Implements(textUnmarshaler)
}

func checkType(t reflect.Type, path []string) error {
	where := func() string {
		if len(path) == 0 {
			return t.String()
		}
		return strings.Join(path, "")
	}
	if trusted(t) {
		return nil
	}
	switch t.Kind() {
	case reflect.Interface:
		return fmt.Errorf("state type: %s is an interface (%s): the default codec cannot restore it", where(), t)
	case reflect.Chan, reflect.Func, reflect.UnsafePointer, reflect.Complex64, reflect.Complex128:
		return fmt.Errorf("state type: %s is a %s: the default codec cannot store it", where(), t.Kind())
	case reflect.Pointer, reflect.Slice, reflect.Array:
		return checkType(t.Elem(), append(path, "[]"))
	case reflect.Map:
		if err := checkType(t.Key(), append(path, "[key]")); err != nil {
			return err
		}
		return checkType(t.Elem(), append(path, "[value]"))
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				return fmt.Errorf("state type %s: field %s is unexported, and the default codec (JSON) would drop it; export it", t, f.Name)
			}
			if f.Tag.Get("json") == "-" {
				return fmt.Errorf("state type %s: field %s has the tag json:\"-\", so the default codec would drop it", t, f.Name)
			}
			if err := checkType(f.Type, append(path, "."+f.Name)); err != nil {
				return err
			}
		}
	}
	return nil
}
