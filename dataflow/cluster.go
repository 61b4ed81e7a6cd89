package dataflow

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/epochflow/epochflow/dataflow/internal/cluster"
	"github.com/epochflow/epochflow/dataflow/internal/engine"
)

// ClusterOptions runs a flow on several processes (Options.Cluster): every process runs the
// same flow with the same Options.Workers, and the workers are numbered across the cluster
// (process p runs workers p*W .. p*W+W-1), so partitions, keys and routes are shared out over
// all of them. Process 0 leads: it collects the workers' frontiers and decides the commits,
// and the others call Commit on their partitions once it announces them. Exchanges routed by
// key (Stateful steps and their operators, partitioned sinks) cross processes over gRPC, the
// items encoded with DefaultCodec; Redistribute balances among the workers of each process.
// If a process fails or a peer's stream breaks, every process stops with an error naming the
// peer. With a recovery store (Options.Recovery, at process 0 only: the others must have
// none), process 0 begins each execution, loads the state and sends it to the others at
// start; they send it their snapshots with their frontiers, and it records each commit before
// announcing it. A cluster may resume with other numbers of processes and workers: state is
// routed by key and partitions are reassigned over all the workers.
type ClusterOptions struct {
	// Addresses has one host:port per process, in process order. Each process listens on its
	// own and connects to the others. One address runs the flow alone, as without Cluster.
	Addresses []string
	// Process is this process's number: its index in Addresses.
	Process int
	// Secret is shared by every process of the cluster, which must prove it knows it before
	// anything else is read from a connection; required with more than one address unless TLS
	// is set (with both, both apply).
	Secret string
	// TLS, when set, runs the exchange between the processes over mutual TLS 1.3 (see
	// ClusterTLS).
	TLS *ClusterTLS
	// PeerTimeout is how long a peer may stay silent before the run fails naming it (heartbeats
	// go every quarter of it), and how long a finishing process waits for its peers to end.
	// 0 means DefaultPeerTimeout.
	PeerTimeout time.Duration
	// StartTimeout bounds the wait for the peers at start (each attempt is logged).
	// 0 means DefaultStartTimeout.
	StartTimeout time.Duration
}

// ClusterTLS names the PEM files of mutual TLS between the processes of a cluster: this
// process's certificate (with its chain) and key, and the CA that signed every process's
// certificate. Both ends of a connection present their certificate and check the other's
// against the CA; the dialer also checks that the server's certificate is valid for the host
// it dialed (its entry in Addresses), and the server that the dialer's is valid for the host of
// the process it says it is (a DNS or IP subject alternative name, or a wildcard such as
// *.flow.NS.svc.cluster.local for every pod of a StatefulSet). Certificates are used for
// both ends, so their extended key usage must allow both server and client authentication (or
// be absent). The files are read at the start of every attempt.
type ClusterTLS struct {
	CertFile, KeyFile, CAFile string
}

// DefaultPeerTimeout is ClusterOptions.PeerTimeout when it is 0.
const DefaultPeerTimeout = cluster.DefaultPeerTimeout

// DefaultStartTimeout is ClusterOptions.StartTimeout when it is 0.
const DefaultStartTimeout = cluster.DefaultStartTimeout

// check validates the options of a run.
func (c *ClusterOptions) check(o Options) error {
	if c == nil {
		return nil
	}
	n := len(c.Addresses)
	if n == 0 {
		return errors.New("cluster: no addresses")
	}
	if c.Process < 0 || c.Process >= n {
		return fmt.Errorf("cluster: process %d is not one of the %d addresses (0 to %d)", c.Process, n, n-1)
	}
	if n > 1 && c.Secret == "" && c.TLS == nil {
		return errors.New("cluster: a secret or TLS is required with more than one address")
	}
	if n > 1 && o.Recovery != nil && c.Process != 0 {
		return fmt.Errorf("cluster: process %d has a recovery store: only process 0 opens it (the others get the "+
			"state from process 0 and send it their snapshots)", c.Process)
	}
	if c.PeerTimeout < 0 || c.StartTimeout < 0 {
		return errors.New("cluster: the peer and start timeouts must not be negative")
	}
	return nil
}

// appendValue appends v's encoding with its length (4 bytes) before it.
func appendValue[V any](dst []byte, c AppendCodec[V], v V) ([]byte, error) {
	at := len(dst)
	dst = append(dst, 0, 0, 0, 0)
	dst, err := c.AppendEncode(dst, v)
	if err != nil {
		return dst, err
	}
	binary.LittleEndian.PutUint32(dst[at:], uint32(len(dst)-at-4))
	return dst, nil
}

// batchReader reads what appendValue and AppendUvarint wrote.
type batchReader struct {
	b   []byte
	err error
}

var errBatch = errors.New("truncated batch")

func (r *batchReader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errBatch
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *batchReader) next(n uint64) []byte {
	if r.err != nil || n > uint64(len(r.b)) {
		r.err = errBatch
		return nil
	}
	p := r.b[:n:n]
	r.b = r.b[n:]
	return p
}

func (r *batchReader) value() []byte {
	n := r.next(4)
	if r.err != nil {
		return nil
	}
	return r.next(uint64(binary.LittleEndian.Uint32(n)))
}

// count reads a batch's length, at most one item per remaining byte.
func (r *batchReader) count() int {
	n := r.uvarint()
	if n > uint64(len(r.b)) {
		r.err = errBatch
		return 0
	}
	return int(n)
}

func appendCodec[V any]() AppendCodec[V] { return DefaultCodec[V]().(AppendCodec[V]) }

// encodedItems counts the items encoded for other processes, by every run of the process (for
// benchmarks: see export_test.go).
var encodedItems atomic.Uint64

// kvCodec encodes the batches of a keyed exchange.
type kvCodec[V any] struct{ c AppendCodec[V] }

func kvBatchCodec[V any]() engine.BatchCodec { return kvCodec[V]{appendCodec[V]()} }

func (k kvCodec[V]) AppendBatch(dst []byte, batch any) ([]byte, error) {
	b := batch.([]KV[V])
	encodedItems.Add(uint64(len(b)))
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	var err error
	for _, kv := range b {
		dst = binary.AppendUvarint(dst, uint64(len(kv.Key)))
		dst = append(dst, kv.Key...)
		if dst, err = appendValue(dst, k.c, kv.Value); err != nil {
			return dst, fmt.Errorf("key %q: %w", kv.Key, err)
		}
	}
	return dst, nil
}

func (k kvCodec[V]) DecodeBatch(data []byte) (any, error) {
	r := batchReader{b: data}
	n := r.count()
	out := make([]KV[V], 0, n)
	for range n {
		key := string(r.next(r.uvarint()))
		v := r.value()
		if r.err != nil {
			break
		}
		val, err := k.c.Decode(key, v)
		if err != nil {
			return nil, err
		}
		out = append(out, KV[V]{Key: key, Value: val})
	}
	return out, r.err
}

func (kvCodec[V]) Check() error { return CheckCodec[V]() }

// itemCodec encodes the batches of an exchange of plain items (a partitioned sink's).
type itemCodec[T any] struct{ c AppendCodec[T] }

func itemBatchCodec[T any]() engine.BatchCodec { return itemCodec[T]{appendCodec[T]()} }

func (k itemCodec[T]) AppendBatch(dst []byte, batch any) ([]byte, error) {
	b := batch.([]T)
	encodedItems.Add(uint64(len(b)))
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	var err error
	for _, item := range b {
		if dst, err = appendValue(dst, k.c, item); err != nil {
			return dst, err
		}
	}
	return dst, nil
}

func (k itemCodec[T]) DecodeBatch(data []byte) (any, error) {
	r := batchReader{b: data}
	n := r.count()
	out := make([]T, 0, n)
	for range n {
		v := r.value()
		if r.err != nil {
			break
		}
		item, err := k.c.Decode("", v)
		if err != nil {
			return nil, err
		}
		out = append(out, item)
	}
	return out, r.err
}

func (itemCodec[T]) Check() error { return CheckCodec[T]() }

// stampCodec encodes the batches of an event-time step's exchange: items with their times and
// the senders' watermark marks.
type stampCodec[V any] struct{ c AppendCodec[V] }

func stampBatchCodec[V any]() engine.BatchCodec { return stampCodec[V]{appendCodec[V]()} }

func (k stampCodec[V]) AppendBatch(dst []byte, batch any) ([]byte, error) {
	b := batch.([]stamped[V])
	encodedItems.Add(uint64(len(b)))
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	var err error
	for _, s := range b {
		dst = append(dst, byte(s.kind))
		dst = binary.AppendVarint(dst, s.ts)
		dst = binary.AppendVarint(dst, s.wm)
		dst = binary.AppendVarint(dst, int64(s.from))
		if s.kind != envItem {
			continue
		}
		dst = binary.AppendUvarint(dst, uint64(len(s.kv.Key)))
		dst = append(dst, s.kv.Key...)
		if dst, err = appendValue(dst, k.c, s.kv.Value); err != nil {
			return dst, fmt.Errorf("key %q: %w", s.kv.Key, err)
		}
	}
	return dst, nil
}

func (k stampCodec[V]) DecodeBatch(data []byte) (any, error) {
	r := batchReader{b: data}
	n := r.count()
	out := make([]stamped[V], 0, n)
	varint := func() int64 {
		if r.err != nil {
			return 0
		}
		v, n := binary.Varint(r.b)
		if n <= 0 {
			r.err = errBatch
			return 0
		}
		r.b = r.b[n:]
		return v
	}
	for range n {
		kind := r.next(1)
		if r.err != nil {
			break
		}
		s := stamped[V]{kind: envKind(kind[0])}
		s.ts, s.wm, s.from = varint(), varint(), int32(varint())
		if s.kind == envItem {
			s.kv.Key = string(r.next(r.uvarint()))
			v := r.value()
			if r.err != nil {
				break
			}
			val, err := k.c.Decode(s.kv.Key, v)
			if err != nil {
				return nil, err
			}
			s.kv.Value = val
		}
		if r.err != nil {
			break
		}
		out = append(out, s)
	}
	return out, r.err
}

func (stampCodec[V]) Check() error { return CheckCodec[V]() }

// runAttempt runs the engine once, on the cluster when there is one: the processes connect
// first, and the transport is closed (telling the peers how the run ended) when the engine
// returns.
//
// With a recovery store (process 0), execution is the store's number of this execution, which
// every frame carries, and the other processes get the committed epoch and the state at start.
func runAttempt(ctx context.Context, f *Flow, opts Options, cfg engine.Config, execution int) (engine.Stats, error) {
	c := opts.Cluster
	if c == nil || len(c.Addresses) < 2 {
		return engine.Run(ctx, &f.graph, cfg)
	}
	var tlsCfg *cluster.TLS
	var err error
	if c.TLS != nil {
		if tlsCfg, err = cluster.LoadTLS(c.TLS.CertFile, c.TLS.KeyFile, c.TLS.CAFile); err != nil {
			return engine.Stats{Committed: max(cfg.StartEpoch, 1) - 1}, fmt.Errorf("cluster TLS: %w", err)
		}
	}
	tc := cluster.Config{Addresses: c.Addresses, Process: c.Process, Secret: []byte(c.Secret),
		TLS: tlsCfg, Workers: cfg.Workers, PeerTimeout: c.PeerTimeout, StartTimeout: c.StartTimeout, Logger: cfg.Logger}
	if c.Process == 0 && cfg.Store != nil {
		tc.Execution = uint64(execution)
		tc.Resume = encodeResume(cfg.StartEpoch-1, cfg.Restored)
	}
	t, err := cluster.Start(ctx, tc)
	if err != nil {
		return engine.Stats{Committed: max(cfg.StartEpoch, 1) - 1}, fmt.Errorf("joining the cluster as process %d: %w", c.Process, err)
	}
	if b := t.Resume(); c.Process != 0 && len(b) > 0 {
		committed, restored, err := decodeResume(b)
		if err != nil {
			err = fmt.Errorf("peer process 0 (%s): the state to resume from: %w", c.Addresses[0], err)
			t.Close(err)
			return engine.Stats{}, err
		}
		cfg.StartEpoch, cfg.Recovery, cfg.Restored = committed+1, true, restored
		cfg.StopWarning = "" // the state is in process 0's store
		if committed > 0 {
			cfg.Logger.Info("resuming from process 0's recovery store", "flow", f.name, "execution", t.Execution(),
				"committed_epoch", committed)
		}
	}
	cfg.Transport = t
	st, err := engine.Run(ctx, &f.graph, cfg)
	t.Close(err)
	return st, err
}
