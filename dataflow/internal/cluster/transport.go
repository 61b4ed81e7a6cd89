// Package cluster carries a flow's exchanges, frontier reports and commit announcements between
// the processes of a cluster over gRPC: one bidirectional stream per pair of processes, opened
// by the higher-numbered process, authenticated (a shared secret, mutual TLS or both) before
// gRPC speaks, and tagged with the execution number in every frame. It knows nothing of the
// engine: the engine hands it encoded batches and gets them back through a Handler.
package cluster

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/peer"
)

// Handler receives what the peers send. Its functions are called from the transport's
// goroutines (one per peer, in the order the peer sent) and must not block long. An error
// fails the transport (see Fail), naming the peer.
type Handler struct {
	// Data is a batch (encoded) or a marker of an exchange edge, from worker from to worker to.
	Data func(edge, from, to int, kind uint8, epoch uint64, payload []byte) error
	// Ack tells that worker to took n more messages of the edge from worker from.
	Ack func(edge, from, to int, n uint64) error
	// Report is a worker's frontier (to the leader, process 0), with the snapshots it took
	// since its last report (encoded, empty when none).
	Report func(worker int, frontier uint64, done bool, pack []byte) error
	// Commit announces that epoch is committed (from the leader).
	Commit func(epoch uint64, final bool)
	// Stop asks for a graceful stop; from is the process that was stopped.
	Stop func(from int)
	// Fail is called once, with the first failure of the transport: a peer's stream broke, a
	// peer went silent for the peer timeout, a peer failed, a peer sent what it must not.
	Fail func(err error)
}

// Config says how a process joins its cluster.
type Config struct {
	// Addresses has one host:port per process, in process order; this process listens on its own.
	Addresses []string
	// Process is this process's number (an index of Addresses); process 0 leads.
	Process int
	// Secret is the shared secret every process proves it knows; it may be empty with TLS.
	Secret []byte
	// TLS, when not nil, runs every connection over mutual TLS (see TLS).
	TLS *TLS
	// Workers is the number of workers of each process; every process must have the same.
	Workers int
	// PeerTimeout is how long a peer may stay silent (heartbeats are sent at a quarter of it)
	// before the cluster fails, and how long Close waits for the peers to finish. 0 means 10s.
	PeerTimeout time.Duration
	// StartTimeout bounds the wait for every peer at start. 0 means one minute.
	StartTimeout time.Duration
	// Logger receives the transport's logs (whom it waits for, refused connections).
	Logger *slog.Logger
	// Execution, at process 0, is the execution number every frame carries (the recovery
	// store's, which fences off processes of earlier executions); 0 picks one at random.
	// The other processes learn it from process 0.
	Execution uint64
	// Resume, at process 0, is sent to every other process before anything else (what
	// the run resumes from); they read it with Resume.
	Resume []byte
}

// DefaultPeerTimeout is Config.PeerTimeout when it is 0.
const DefaultPeerTimeout = 10 * time.Second

// DefaultStartTimeout is Config.StartTimeout when it is 0.
const DefaultStartTimeout = time.Minute

// maxChunk is the size past which queued messages go into a new frame.
const maxChunk = 1 << 20

// window is gRPC's flow-control window of a stream and of a connection.
const window = 8 << 20

// maxFrame bounds a frame gRPC accepts (a batch bigger than this cannot cross).
const maxFrame = 256 << 20

const method = "/epochflow.Cluster/Exchange"

var streamDesc = grpc.StreamDesc{StreamName: "Exchange", ServerStreams: true, ClientStreams: true}

// msgStream is what both sides of a gRPC stream offer.
type msgStream interface {
	SendMsg(m any) error
	RecvMsg(m any) error
}

// Transport is this process's end of the cluster.
type Transport struct {
	cfg       Config
	log       *slog.Logger
	exec      uint64
	execKnown chan struct{}
	resume    []byte      // what process 0 sent in its hello
	peers     []*peerConn // nil at this process
	lis       net.Listener
	srv       *grpc.Server
	ctx       context.Context // ends every stream
	cancel    context.CancelFunc
	wg        sync.WaitGroup

	attached chan struct{}
	h        Handler
	closing  atomic.Bool

	failOnce sync.Once
	failed   chan struct{}
	failErr  error
}

type peerConn struct {
	t       *Transport
	id      int
	addr    string
	claimed atomic.Bool
	ready   chan struct{} // closed once the stream is up
	stream  msgStream
	client  grpc.ClientStream // for the dialing side
	conn    *grpc.ClientConn

	mu     sync.Mutex
	chunks [][]byte
	final  bool // Close queued the last message
	wake   chan struct{}

	lastRecv atomic.Int64 // unix nanoseconds
	bye      atomic.Bool  // the peer finished
	recvDone chan struct{}
	sendDone chan struct{}
}

func (p *peerConn) name() string { return fmt.Sprintf("process %d (%s)", p.id, p.addr) }

// Start listens on this process's address, connects to every peer (waiting for them with
// backoff up to the start timeout, logging whom it waits for) and learns the execution number
// from process 0, which picks it at random. What peers send is held until Attach.
func Start(ctx context.Context, cfg Config) (*Transport, error) {
	n := len(cfg.Addresses)
	if n < 2 {
		return nil, errors.New("a cluster needs at least two addresses")
	}
	if cfg.Process < 0 || cfg.Process >= n {
		return nil, fmt.Errorf("process %d is not one of the %d addresses", cfg.Process, n)
	}
	if len(cfg.Secret) == 0 && cfg.TLS == nil {
		return nil, errors.New("a cluster of several processes needs a secret or TLS")
	}
	if cfg.PeerTimeout <= 0 {
		cfg.PeerTimeout = DefaultPeerTimeout
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	t := &Transport{cfg: cfg, log: cfg.Logger.With("process", cfg.Process), execKnown: make(chan struct{}),
		peers: make([]*peerConn, n), attached: make(chan struct{}), failed: make(chan struct{})}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for i, a := range cfg.Addresses {
		if i != cfg.Process {
			t.peers[i] = &peerConn{t: t, id: i, addr: a, ready: make(chan struct{}), wake: make(chan struct{}, 1),
				recvDone: make(chan struct{}), sendDone: make(chan struct{})}
		}
	}
	self := cfg.Addresses[cfg.Process]
	deadline := time.Now().Add(cfg.StartTimeout)
	lis, err := listen(ctx, t.log, self, deadline)
	if err != nil {
		t.cancel()
		return nil, fmt.Errorf("listening on %s (process %d's address): %w", self, cfg.Process, err)
	}
	t.lis = lis
	t.srv = grpc.NewServer(grpc.Creds(&creds{secret: cfg.Secret, self: cfg.Process, log: t.log, tls: cfg.TLS, addrs: cfg.Addresses}),
		grpc.ForceServerCodecV2(codec{}), grpc.ConnectionTimeout(handshakeMax), grpc.MaxRecvMsgSize(maxFrame),
		grpc.InitialWindowSize(window), grpc.InitialConnWindowSize(window))
	t.srv.RegisterService(&grpc.ServiceDesc{ServiceName: "epochflow.Cluster", HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{StreamName: "Exchange", Handler: t.serve, ServerStreams: true, ClientStreams: true}}}, t)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		t.srv.Serve(lis)
	}()
	if cfg.Process == 0 {
		var b [8]byte
		t.exec = cfg.Execution
		for t.exec == 0 {
			rand.Read(b[:])
			t.exec = binary.LittleEndian.Uint64(b[:]) >> 1
		}
		close(t.execKnown)
	}
	for j := range cfg.Process {
		if err := t.dial(ctx, t.peers[j], deadline); err != nil {
			t.shutdown()
			return nil, err
		}
	}
	if err := t.awaitPeers(ctx, deadline); err != nil {
		t.shutdown()
		return nil, err
	}
	t.log.Info("connected to every peer", "processes", n, "execution", t.exec)
	return t, nil
}

// listen listens on this process's address. While its host name does not resolve (a pod of a
// StatefulSet starts before its DNS record is published), or while the address is in use (a
// process of an earlier execution that has not exited yet, such as one that was stopped and
// is now failing), it retries with backoff until deadline, logging the wait.
func listen(ctx context.Context, log *slog.Logger, self string, deadline time.Time) (net.Listener, error) {
	wait := 50 * time.Millisecond
	var logged time.Time
	for {
		lis, err := net.Listen("tcp", self)
		var dnsErr *net.DNSError
		inUse := errors.Is(err, syscall.EADDRINUSE)
		if err == nil || (!errors.As(err, &dnsErr) && !inUse) || time.Now().Add(wait).After(deadline) {
			return lis, err
		}
		if time.Since(logged) > 2*time.Second {
			if inUse {
				log.Info("waiting for this process's address to be free", "address", self, "error", err.Error())
			} else {
				log.Info("waiting for this process's address to resolve", "address", self, "error", err.Error())
			}
			logged = time.Now()
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, ctx.Err()
		}
		wait = min(wait*2, time.Second)
	}
}

// sentFrames and sentBytes count the frames and their bytes sent by every transport of the
// process (for benchmarks: see Sent).
var sentFrames, sentBytes atomic.Uint64

// Sent returns how many frames, and bytes in them, the transports of this process have sent
// to their peers since it started (heartbeats and acknowledgements included).
func Sent() (frames, bytes uint64) { return sentFrames.Load(), sentBytes.Load() }

// Process is this process's number.
func (t *Transport) Process() int { return t.cfg.Process }

// Processes is the number of processes.
func (t *Transport) Processes() int { return len(t.cfg.Addresses) }

// Execution is the execution number every frame carries.
func (t *Transport) Execution() uint64 { return t.exec }

// Resume is what process 0 gave as Config.Resume (at process 0 too).
func (t *Transport) Resume() []byte {
	if t.cfg.Process == 0 {
		return t.cfg.Resume
	}
	return t.resume
}

// awaitPeers waits for the higher-numbered processes to dial this one.
func (t *Transport) awaitPeers(ctx context.Context, deadline time.Time) error {
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	timeout := time.NewTimer(time.Until(deadline))
	defer timeout.Stop()
	for {
		var waiting []string
		for _, p := range t.peers {
			if p == nil {
				continue
			}
			select {
			case <-p.ready:
			default:
				waiting = append(waiting, p.name())
			}
		}
		if len(waiting) == 0 {
			return nil
		}
		select {
		case <-tick.C:
			t.log.Info("waiting for peers to connect", "peers", strings.Join(waiting, ", "))
		case <-timeout.C:
			return fmt.Errorf("waited %v for %s to connect: start them with the same -addresses and "+
				"-cluster-secret", t.cfg.StartTimeout, strings.Join(waiting, ", "))
		case <-t.failed:
			return t.failErr
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", strings.Join(waiting, ", "), ctx.Err())
		case <-peerReady(t.peers):
		}
	}
}

// peerReady returns a channel that is ready when some peer not yet connected is (or nil).
func peerReady(peers []*peerConn) <-chan struct{} {
	for _, p := range peers {
		if p == nil {
			continue
		}
		select {
		case <-p.ready:
		default:
			return p.ready
		}
	}
	return nil
}

// dial opens the stream to a lower-numbered process, retrying with backoff until deadline.
func (t *Transport) dial(ctx context.Context, p *peerConn, deadline time.Time) error {
	cc, err := grpc.NewClient("passthrough:///"+p.addr,
		grpc.WithTransportCredentials(&creds{secret: t.cfg.Secret, self: t.cfg.Process, to: p.id, log: t.log,
			tls: t.cfg.TLS, addrs: t.cfg.Addresses}),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(codec{}), grpc.MaxCallRecvMsgSize(maxFrame)),
		grpc.WithInitialWindowSize(window), grpc.WithInitialConnWindowSize(window), grpc.WithContextDialer(dialPeer),
		grpc.WithConnectParams(grpc.ConnectParams{MinConnectTimeout: handshakeMax,
			Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}}))
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", p.name(), err)
	}
	p.conn = cc
	wait := 50 * time.Millisecond
	var logged time.Time
	for {
		err := t.open(p, cc, deadline)
		if err == nil {
			return nil
		}
		select {
		case <-t.failed:
			return t.failErr
		default:
		}
		if time.Now().Add(wait).After(deadline) {
			return fmt.Errorf("%s did not answer within %v: %w", p.name(), t.cfg.StartTimeout, err)
		}
		if time.Since(logged) > 2*time.Second {
			t.log.Info("waiting for a peer", "peer", p.name(), "error", err.Error())
			logged = time.Now()
		}
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return fmt.Errorf("waiting for %s: %w", p.name(), ctx.Err())
		}
		wait = min(wait*2, time.Second)
	}
}

// open opens the stream on cc and reads the peer's hello.
func (t *Transport) open(p *peerConn, cc *grpc.ClientConn, deadline time.Time) error {
	sctx, cancel := context.WithCancel(t.ctx)
	cs, err := cc.NewStream(sctx, &streamDesc, method)
	if err != nil {
		cancel()
		return err
	}
	stop := time.AfterFunc(time.Until(deadline), cancel)
	var f frame
	err = cs.RecvMsg(&f)
	stop.Stop()
	if err != nil {
		cancel()
		return err
	}
	r := reader{b: f.b[min(len(f.b), frameHeader):]}
	if len(f.b) < frameHeader || r.byte() != kindHello {
		cancel()
		return fmt.Errorf("%s sent no hello", p.name())
	}
	if w := r.int(); r.err != nil || w != t.cfg.Workers {
		cancel()
		t.fail(fmt.Errorf("%s runs %d workers, this process %d: every process must have the same -workers", p.name(), w, t.cfg.Workers))
		return t.failErr
	}
	resume := r.bytes()
	if r.err != nil {
		cancel()
		return fmt.Errorf("%s sent a malformed hello: %w", p.name(), r.err)
	}
	exec := binary.LittleEndian.Uint64(f.b)
	if p.id == 0 {
		t.exec = exec
		t.resume = resume
		close(t.execKnown)
	} else if exec != t.exec {
		cancel()
		return fmt.Errorf("%s is in execution %d, process 0 in %d: start every process again", p.name(), exec, t.exec)
	}
	p.claimed.Store(true)
	p.client = cs
	t.run(p, cs, func() {
		t.receive(p)
		cancel()
	})
	return nil
}

// serve is the handler of a stream a higher-numbered process opened.
func (t *Transport) serve(_ any, ss grpc.ServerStream) error {
	pi, ok := peer.FromContext(ss.Context())
	var from int
	if ai, isOurs := pi.AuthInfo.(authInfo); ok && isOurs {
		from = ai.process
	} else {
		return errors.New("unauthenticated")
	}
	if from <= t.cfg.Process || from >= len(t.peers) {
		t.log.Warn("refused a stream", "from_process", from, "reason", "only a higher-numbered process of the -addresses opens a stream to this one")
		return errRefused
	}
	p := t.peers[from]
	if !p.claimed.CompareAndSwap(false, true) {
		t.log.Warn("refused a second stream", "peer", p.name())
		return errRefused
	}
	timer := time.NewTimer(t.cfg.StartTimeout)
	defer timer.Stop()
	select {
	case <-t.execKnown:
	case <-timer.C:
		return errors.New("no execution")
	case <-t.ctx.Done():
		return t.ctx.Err()
	}
	hello := binary.LittleEndian.AppendUint64(nil, t.exec)
	hello = appendUvarints(hello, kindHello, uint64(t.cfg.Workers))
	var resume []byte
	if t.cfg.Process == 0 {
		resume = t.cfg.Resume
	}
	hello = appendBytes(hello, resume)
	if err := ss.SendMsg(&frame{b: hello}); err != nil {
		t.fail(fmt.Errorf("peer %s: sending the hello: %w", p.name(), err))
		return err
	}
	done := make(chan struct{})
	t.run(p, ss, func() {
		t.receive(p)
		close(done)
	})
	<-done
	<-p.sendDone
	return nil
}

// run starts a peer's sender and receiver once its stream is up.
func (t *Transport) run(p *peerConn, s msgStream, receive func()) {
	p.stream = s
	p.lastRecv.Store(time.Now().UnixNano())
	close(p.ready)
	t.wg.Add(2)
	go func() {
		defer t.wg.Done()
		p.send()
	}()
	go func() {
		defer t.wg.Done()
		defer close(p.recvDone)
		receive()
	}()
}

// Attach starts delivering what the peers send to h, and starts watching them for silence.
// It is called once.
func (t *Transport) Attach(h Handler) {
	t.h = h
	now := time.Now().UnixNano()
	for _, p := range t.peers {
		if p != nil {
			p.lastRecv.Store(now)
		}
	}
	close(t.attached)
	select {
	case <-t.failed:
		h.Fail(t.failErr)
	default:
	}
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		t.watch()
	}()
}

// watch fails the transport when a peer has sent nothing (not even a heartbeat) for the peer
// timeout.
func (t *Transport) watch() {
	tick := time.NewTicker(t.cfg.PeerTimeout / 8)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
		case <-t.ctx.Done():
			return
		}
		if t.closing.Load() {
			return
		}
		for _, p := range t.peers {
			if p == nil || p.bye.Load() {
				continue
			}
			if d := time.Since(time.Unix(0, p.lastRecv.Load())); d > t.cfg.PeerTimeout {
				t.fail(fmt.Errorf("peer %s sent nothing for %v (the peer timeout): it is stopped, hung or cut off",
					p.name(), d.Round(time.Millisecond)))
			}
		}
	}
}

func (t *Transport) fail(err error) {
	t.failOnce.Do(func() {
		t.failErr = err
		close(t.failed)
		select {
		case <-t.attached:
			t.h.Fail(err)
		default:
		}
	})
}

// receive reads a peer's frames until its stream ends.
func (t *Transport) receive(p *peerConn) {
	for {
		var f frame
		err := p.stream.RecvMsg(&f)
		if err != nil {
			if p.bye.Load() || t.closing.Load() {
				return
			}
			if errors.Is(err, io.EOF) {
				t.fail(fmt.Errorf("peer %s ended its stream before the flow finished", p.name()))
			} else {
				t.fail(fmt.Errorf("peer %s: the stream broke: %w", p.name(), err))
			}
			return
		}
		p.lastRecv.Store(time.Now().UnixNano())
		if len(f.b) < frameHeader {
			t.fail(fmt.Errorf("peer %s sent a malformed frame of %d bytes", p.name(), len(f.b)))
			return
		}
		if exec := binary.LittleEndian.Uint64(f.b); exec != t.exec {
			t.fail(fmt.Errorf("peer %s sent a frame of execution %d, this execution is %d: refused (a process "+
				"left from an earlier execution?)", p.name(), exec, t.exec))
			return
		}
		select {
		case <-t.attached:
		case <-t.ctx.Done():
			return
		}
		if err := t.dispatch(p, f.b[frameHeader:]); err != nil {
			t.fail(fmt.Errorf("peer %s: %w", p.name(), err))
			return
		}
	}
}

func (t *Transport) dispatch(p *peerConn, b []byte) error {
	r := reader{b: b}
	for len(r.b) > 0 && r.err == nil {
		switch kind := r.byte(); kind {
		case kindData:
			edge, from, to, mk, epoch := r.int(), r.int(), r.int(), r.byte(), r.uvarint()
			payload := r.bytes()
			if r.err == nil {
				if err := t.h.Data(edge, from, to, mk, epoch, payload); err != nil {
					return err
				}
			}
		case kindAck:
			edge, from, to, n := r.int(), r.int(), r.int(), r.uvarint()
			if r.err == nil {
				if err := t.h.Ack(edge, from, to, n); err != nil {
					return err
				}
			}
		case kindReport:
			w, f, done, pack := r.int(), r.uvarint(), r.byte(), r.bytes()
			if r.err == nil {
				if t.cfg.Process != 0 {
					return errors.New("sent a frontier report to a process that does not lead")
				}
				if err := t.h.Report(w, f, done == 1, pack); err != nil {
					return err
				}
			}
		case kindCommit:
			e, final := r.uvarint(), r.byte()
			if r.err == nil {
				if p.id != 0 {
					return errors.New("announced a commit, which only process 0 does")
				}
				t.h.Commit(e, final == 1)
			}
		case kindStop:
			t.h.Stop(p.id)
		case kindBye:
			p.bye.Store(true)
		case kindAbort:
			msg := r.bytes()
			if r.err == nil {
				return fmt.Errorf("failed: %s", msg)
			}
		case kindHeartbeat, kindHello:
		default:
			return fmt.Errorf("sent a message of unknown kind %d", kind)
		}
	}
	if r.err != nil {
		return fmt.Errorf("sent a malformed message: %w", r.err)
	}
	return nil
}

// enqueue appends a message for a peer; the peer's sender sends it.
func (p *peerConn) enqueue(add func([]byte) []byte) {
	p.mu.Lock()
	if p.final {
		p.mu.Unlock()
		return
	}
	n := len(p.chunks)
	if n == 0 || len(p.chunks[n-1]) > maxChunk {
		p.chunks = append(p.chunks, binary.LittleEndian.AppendUint64(make([]byte, 0, 4096), p.t.exec))
		n++
	}
	p.chunks[n-1] = add(p.chunks[n-1])
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// send writes the queued frames, and a heartbeat when there is nothing to send, until Close
// has queued the last message and it is sent.
func (p *peerConn) send() {
	defer close(p.sendDone)
	t := p.t
	tick := time.NewTicker(t.cfg.PeerTimeout / 4)
	defer tick.Stop()
	for {
		heartbeat := false
		select {
		case <-p.wake:
		case <-tick.C:
			heartbeat = true
		case <-t.ctx.Done():
			return
		}
		p.mu.Lock()
		chunks, final := p.chunks, p.final
		p.chunks = nil
		p.mu.Unlock()
		if len(chunks) == 0 && heartbeat {
			chunks = [][]byte{append(binary.LittleEndian.AppendUint64(nil, t.exec), kindHeartbeat)}
		}
		for _, c := range chunks {
			sentFrames.Add(1)
			sentBytes.Add(uint64(len(c)))
			if err := p.stream.SendMsg(&frame{b: c}); err != nil {
				if !t.closing.Load() {
					t.fail(fmt.Errorf("peer %s: sending: the stream broke: %w", p.name(), err))
				}
				return
			}
		}
		if final {
			if p.client != nil {
				p.client.CloseSend()
			}
			return
		}
	}
}

// SendData sends a batch (encoded) or a marker of an exchange edge to a worker of peer.
func (t *Transport) SendData(peer, edge, from, to int, kind uint8, epoch uint64, payload []byte) {
	t.peers[peer].enqueue(func(b []byte) []byte {
		b = appendUvarints(b, kindData, uint64(edge), uint64(from), uint64(to))
		b = append(b, kind)
		b = binary.AppendUvarint(b, epoch)
		return appendBytes(b, payload)
	})
}

// SendAck tells the sending worker from, on peer, that worker to took n more of its messages.
func (t *Transport) SendAck(peer, edge, from, to int, n uint64) {
	t.peers[peer].enqueue(func(b []byte) []byte {
		return appendUvarints(b, kindAck, uint64(edge), uint64(from), uint64(to), n)
	})
}

// SendReport sends a worker's frontier to the leader, with the snapshots it took since its
// last report (encoded; empty for none).
func (t *Transport) SendReport(worker int, frontier uint64, done bool, pack []byte) {
	d := byte(0)
	if done {
		d = 1
	}
	t.peers[0].enqueue(func(b []byte) []byte {
		return appendBytes(append(appendUvarints(b, kindReport, uint64(worker), frontier), d), pack)
	})
}

// SendCommit announces a committed epoch to every peer (the leader only).
func (t *Transport) SendCommit(epoch uint64, final bool) {
	d := byte(0)
	if final {
		d = 1
	}
	t.broadcast(func(b []byte) []byte { return append(appendUvarints(b, kindCommit, epoch), d) })
}

// SendStop asks every peer to stop gracefully.
func (t *Transport) SendStop() {
	t.broadcast(func(b []byte) []byte { return append(b, kindStop) })
}

func (t *Transport) broadcast(add func([]byte) []byte) {
	for _, p := range t.peers {
		if p != nil {
			p.enqueue(add)
		}
	}
}

// Close ends this process's part: it tells every peer that it finished (runErr nil) or failed
// (with runErr's text), sends what is queued, waits up to the peer timeout for the peers to
// end their streams, then closes everything. No goroutine of the transport outlives it.
func (t *Transport) Close(runErr error) {
	t.closing.Store(true)
	for _, p := range t.peers {
		if p == nil {
			continue
		}
		if runErr == nil {
			p.enqueue(func(b []byte) []byte { return append(b, kindBye) })
		} else {
			p.enqueue(func(b []byte) []byte { return appendBytes(append(b, kindAbort), []byte(runErr.Error())) })
		}
		p.mu.Lock()
		p.final = true
		p.mu.Unlock()
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	timer := time.NewTimer(t.cfg.PeerTimeout)
	defer timer.Stop()
	for _, p := range t.peers {
		if p == nil {
			continue
		}
		select {
		case <-p.ready:
		default:
			continue
		}
		select {
		case <-p.recvDone:
		case <-timer.C:
		}
	}
	t.shutdown()
}

func (t *Transport) shutdown() {
	t.closing.Store(true)
	t.cancel()
	t.srv.Stop()
	for _, p := range t.peers {
		if p != nil && p.conn != nil {
			p.conn.Close()
		}
	}
	t.wg.Wait()
}
