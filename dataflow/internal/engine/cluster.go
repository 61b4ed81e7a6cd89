package engine

import (
	"fmt"

	"github.com/epochflow/epochflow/dataflow/internal/cluster"
)

// Transport is what a run on several processes needs of its cluster (package cluster
// implements it): the workers are numbered across the cluster (process p runs workers
// p*W .. p*W+W-1), the exchanges' channels to and from other processes' workers go through it,
// the workers' frontiers go to process 0, which decides the commits and announces them.
type Transport interface {
	// Process is this process's number; Processes the number of processes.
	Process() int
	Processes() int
	// Attach starts delivering what the peers send; it is called once, before the workers run.
	Attach(h cluster.Handler)
	SendData(peer, edge, from, to int, kind uint8, epoch uint64, payload []byte)
	SendAck(peer, edge, from, to int, n uint64)
	SendReport(worker int, frontier uint64, done bool, pack []byte)
	SendCommit(epoch uint64, final bool)
	SendStop()
}

// encoded is a batch as it came from another process, decoded by the receiving worker.
type encoded []byte

// remoteOut is the sending end of a channel to a worker of another process: it encodes each
// batch on the sending worker and queues it for the peer. The mailbox's count is what was sent
// and not yet acknowledged, so a sender stops reading its sources when a remote receiver
// falls behind, as it does for a local one.
type remoteOut struct {
	r                    *run
	peer, edge, from, to int
	codec                BatchCodec
	router               Router
}

func (o *remoteOut) send(m *mailbox, msg message) {
	var payload []byte
	if msg.kind == msgData {
		b, err := o.codec.AppendBatch(nil, msg.batch)
		if err != nil {
			o.r.fail(&StepError{Step: o.r.p.steps[o.r.p.edges[o.edge].to].ID, Worker: o.from,
				Err: fmt.Errorf("encoding a batch for worker %d of process %d: %w", o.to, o.peer, err)})
			return
		}
		payload = b
		if o.router != nil {
			o.router.Recycle(msg.batch)
		}
	}
	m.n.Add(1)
	o.r.cfg.Transport.SendData(o.peer, o.edge, o.from, o.to, uint8(msg.kind), msg.epoch, payload)
}

// remoteIn is the receiving end of a channel from a worker of another process: it acknowledges
// what the receiving worker took, in groups, so that the sender's count falls.
type remoteIn struct {
	t                    Transport
	peer, edge, from, to int
	taken                uint64
}

func (in *remoteIn) took(left int32) {
	in.taken++
	if in.taken >= lowWater || left == 0 {
		in.t.SendAck(in.peer, in.edge, in.from, in.to, in.taken)
		in.taken = 0
	}
}

// handler is how the transport hands over what the peers send.
func (r *run) handler(workers []*worker) cluster.Handler {
	total := r.total
	local := func(g int) *worker {
		if g < r.base || g >= r.base+len(workers) {
			return nil
		}
		return workers[g-r.base]
	}
	return cluster.Handler{
		Data: func(edge, from, to int, kind uint8, epoch uint64, payload []byte) error {
			w := local(to)
			if w == nil || edge >= len(r.p.edges) || from >= total || w.inbox[edge] == nil ||
				w.inbox[edge][from] == nil || w.inbox[edge][from].in == nil || msgKind(kind) > msgStop {
				return fmt.Errorf("sent a message of edge %d from worker %d to worker %d, which this process does not "+
					"receive (do all processes run the same flow with the same -workers?)", edge, from, to)
			}
			w.inbox[edge][from].send(message{kind: msgKind(kind), epoch: epoch, batch: encoded(payload)})
			return nil
		},
		Ack: func(edge, from, to int, n uint64) error {
			w := local(from)
			if w == nil || edge >= len(r.p.edges) || to >= total || w.outbox[edge] == nil ||
				w.outbox[edge][to] == nil || w.outbox[edge][to].out == nil {
				return fmt.Errorf("acknowledged edge %d from worker %d to worker %d, which this process does not send", edge, from, to)
			}
			mb := w.outbox[edge][to]
			if left := mb.n.Add(-int32(n)); left <= lowWater && left+int32(n) > lowWater {
				w.wakeUp()
			}
			return nil
		},
		Report: func(worker int, frontier uint64, done bool, data []byte) error {
			if worker >= total {
				return fmt.Errorf("reported the frontier of worker %d, of %d", worker, total)
			}
			var pack *Pack
			if len(data) > 0 {
				if r.cfg.Store == nil {
					return fmt.Errorf("sent the snapshots of worker %d, but this process has no recovery store "+
						"(give process 0 the -recovery store)", worker)
				}
				pack = r.coord.reuse()
				if err := pack.UnmarshalBinary(data); err != nil {
					return fmt.Errorf("sent the snapshots of worker %d: %w", worker, err)
				}
			}
			r.coord.report(worker, frontier, done, pack)
			return nil
		},
		Commit: func(epoch uint64, final bool) {
			r.coord.mu.Lock()
			defer r.coord.mu.Unlock()
			r.coord.publish(epoch, final)
		},
		Stop: func(from int) {
			r.stopPeer.CompareAndSwap(0, int64(from)+1)
			r.stop()
		},
		Fail: r.fail,
	}
}
