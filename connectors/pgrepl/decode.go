package pgrepl

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgtype"
)

// Type OIDs of the types decoded to Go values (see the package doc).
const (
	oidBool        = 16
	oidBytea       = 17
	oidName        = 19
	oidInt8        = 20
	oidInt2        = 21
	oidInt4        = 23
	oidText        = 25
	oidJSON        = 114
	oidFloat4      = 700
	oidFloat8      = 701
	oidBPChar      = 1042
	oidVarchar     = 1043
	oidDate        = 1082
	oidTimestamp   = 1114
	oidTimestamptz = 1184
	oidNumeric     = 1700
	oidUUID        = 2950
	oidJSONB       = 3802
)

// arrayElem maps the array types decoded to []any to their element types.
var arrayElem = map[uint32]uint32{
	1000: oidBool, 1001: oidBytea, 1003: oidName, 1016: oidInt8, 1005: oidInt2, 1007: oidInt4,
	1009: oidText, 199: oidJSON, 1021: oidFloat4, 1022: oidFloat8, 1014: oidBPChar,
	1015: oidVarchar, 1182: oidDate, 1115: oidTimestamp, 1185: oidTimestamptz, 1231: oidNumeric,
	2951: oidUUID, 3807: oidJSONB,
}

// decoder turns text-format values of pgoutput into Go values. It is used by one goroutine.
type decoder struct {
	m *pgtype.Map
}

func newDecoder() *decoder { return &decoder{m: pgtype.NewMap()} }

// Decode decodes one text-format value of type oid as the package doc says. It is exported for
// tests and tools that hold text-format values of their own.
func Decode(oid uint32, text []byte) (any, error) { return newDecoder().decode(oid, text) }

// typeName returns the name pgx knows for oid, or "".
func (d *decoder) typeName(oid uint32) string {
	if t, ok := d.m.TypeForOID(oid); ok {
		return t.Name
	}
	return ""
}

func (d *decoder) decode(oid uint32, src []byte) (any, error) {
	switch oid {
	case oidBool:
		switch string(src) {
		case "t":
			return true, nil
		case "f":
			return false, nil
		}
		return nil, fmt.Errorf("invalid bool %q", src)
	case oidInt2:
		n, err := strconv.ParseInt(string(src), 10, 16)
		return int16(n), err
	case oidInt4:
		n, err := strconv.ParseInt(string(src), 10, 32)
		return int32(n), err
	case oidInt8:
		n, err := strconv.ParseInt(string(src), 10, 64)
		return n, err
	case oidFloat4:
		f, err := strconv.ParseFloat(string(src), 32)
		return float32(f), err
	case oidFloat8:
		return strconv.ParseFloat(string(src), 64)
	case oidText, oidVarchar, oidBPChar, oidName:
		return string(src), nil
	case oidBytea:
		if len(src) >= 2 && src[0] == '\\' && src[1] == 'x' {
			b := make([]byte, hex.DecodedLen(len(src)-2))
			if _, err := hex.Decode(b, src[2:]); err != nil {
				return nil, fmt.Errorf("invalid bytea: %w", err)
			}
			return b, nil
		}
		return d.viaPgx(oid, src)
	case oidUUID:
		return parseUUID(src)
	case oidJSON, oidJSONB:
		return json.RawMessage(append([]byte(nil), src...)), nil
	case oidDate, oidTimestamp, oidTimestamptz, oidNumeric:
		return d.viaPgx(oid, src)
	}
	if elem, ok := arrayElem[oid]; ok {
		return d.decodeArray(elem, src)
	}
	return string(src), nil
}

func (d *decoder) viaPgx(oid uint32, src []byte) (any, error) {
	t, ok := d.m.TypeForOID(oid)
	if !ok {
		return string(src), nil
	}
	return t.Codec.DecodeValue(d.m, oid, pgtype.TextFormatCode, src)
}

func parseUUID(src []byte) ([16]byte, error) {
	var u [16]byte
	s := strings.ReplaceAll(string(src), "-", "")
	if len(s) != 32 {
		return u, fmt.Errorf("invalid uuid %q", src)
	}
	if _, err := hex.Decode(u[:], []byte(s)); err != nil {
		return u, fmt.Errorf("invalid uuid %q", src)
	}
	return u, nil
}

// decodeArray parses an array in text format ({1,2,NULL}, {{"a","b"},{"c","d"}}, with an
// optional [1:2]= dimension prefix) into []any, nested for more than one dimension, with the
// elements decoded as elem.
func (d *decoder) decodeArray(elem uint32, src []byte) (any, error) {
	s := string(src)
	if strings.HasPrefix(s, "[") {
		i := strings.Index(s, "=")
		if i < 0 {
			return nil, fmt.Errorf("invalid array %q", s)
		}
		s = s[i+1:]
	}
	p := arrayParser{s: s, d: d, elem: elem}
	v, err := p.parse()
	if err != nil {
		return nil, fmt.Errorf("invalid array %q: %w", src, err)
	}
	p.skipSpace()
	if p.i != len(p.s) {
		return nil, fmt.Errorf("invalid array %q: trailing text", src)
	}
	return v, nil
}

type arrayParser struct {
	s    string
	i    int
	d    *decoder
	elem uint32
}

func (p *arrayParser) skipSpace() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == '\n' || p.s[p.i] == '\r') {
		p.i++
	}
}

var errArray = errors.New("malformed array")

// parse reads {elem,elem,...} at p.i.
func (p *arrayParser) parse() ([]any, error) {
	p.skipSpace()
	if p.i >= len(p.s) || p.s[p.i] != '{' {
		return nil, errArray
	}
	p.i++
	out := []any{}
	p.skipSpace()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return out, nil
	}
	for {
		p.skipSpace()
		if p.i >= len(p.s) {
			return nil, errArray
		}
		switch p.s[p.i] {
		case '{':
			sub, err := p.parse()
			if err != nil {
				return nil, err
			}
			out = append(out, sub)
		case '"':
			p.i++
			var b strings.Builder
			for {
				if p.i >= len(p.s) {
					return nil, errArray
				}
				c := p.s[p.i]
				p.i++
				if c == '\\' {
					if p.i >= len(p.s) {
						return nil, errArray
					}
					b.WriteByte(p.s[p.i])
					p.i++
					continue
				}
				if c == '"' {
					break
				}
				b.WriteByte(c)
			}
			v, err := p.d.decode(p.elem, []byte(b.String()))
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		default:
			start := p.i
			for p.i < len(p.s) && p.s[p.i] != ',' && p.s[p.i] != '}' {
				p.i++
			}
			tok := strings.Trim(p.s[start:p.i], " \t\n\r\v\f") // ASCII white space, as array_in
			if strings.EqualFold(tok, "NULL") {
				out = append(out, nil)
			} else {
				v, err := p.d.decode(p.elem, []byte(tok))
				if err != nil {
					return nil, err
				}
				out = append(out, v)
			}
		}
		p.skipSpace()
		if p.i >= len(p.s) {
			return nil, errArray
		}
		switch p.s[p.i] {
		case ',':
			p.i++
		case '}':
			p.i++
			return out, nil
		default:
			return nil, errArray
		}
	}
}
