// Package emulator serves the goaws SQS emulator (github.com/Admiral-Piett/goaws, v0.5.4) on a
// loopback port, with what the tests of this module need around it: a guard that makes goaws
// safe to serve concurrently (see guard), a restart of its endpoint that keeps its queues, and a
// control handler that reads and changes its state directly (message counts, expiry).
//
// It runs in the process of internal/sqstest/sqsemu, which internal/sqstest starts for each
// test binary: so goaws, which scans a whole queue on every call, is not instrumented by the
// race detector of the tests that use it. goaws keeps its queues in package-level variables, so
// there is one Server per process.
package emulator

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"

	"github.com/Admiral-Piett/goaws/app/gosqs"
	"github.com/Admiral-Piett/goaws/app/models"
	"github.com/Admiral-Piett/goaws/app/router"
	"github.com/sirupsen/logrus"
)

// Region is the region of the emulator's queue URLs.
const Region = "us-east-1"

// AccountID is the account of the emulator's queue URLs.
const AccountID = "100010001000"

// Server is a running goaws.
type Server struct {
	// URL is the SQS endpoint, such as http://127.0.0.1:41234.
	URL string

	srvMu sync.Mutex // guards srv against Restart and Close
	srv   *httptest.Server
	quit  chan bool
	done  chan struct{}
}

var (
	mu      sync.Mutex
	running *Server
)

// Start starts goaws on addr (host:port; port 0 picks a free one), with its visibility-expiry
// task (once a second), and returns it. Only one Server may run at a time in a process: Start
// fails while another runs.
func Start(addr string) (*Server, error) {
	mu.Lock()
	defer mu.Unlock()
	if running != nil {
		return nil, fmt.Errorf("emulator: goaws is already served at %s (its state is per process)", running.URL)
	}
	logrus.SetOutput(io.Discard)
	logrus.SetLevel(logrus.PanicLevel)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("emulator: listen on %s: %w", addr, err)
	}
	tcp := ln.Addr().(*net.TCPAddr)
	models.CurrentEnvironment = models.Environment{
		Host: tcp.IP.String(), Port: strconv.Itoa(tcp.Port), Region: Region, AccountID: AccountID,
		EnableDuplicates: true,
		QueueAttributeDefaults: models.EnvQueueAttributes{
			VisibilityTimeout: 30, MaximumMessageSize: 262144,
		},
	}
	models.SyncQueues.Lock()
	models.SyncQueues.Queues = make(map[string]*models.Queue)
	models.SyncQueues.Unlock()
	srv := serve(ln, &guard{next: router.New()})
	s := &Server{URL: srv.URL, srv: srv, quit: make(chan bool), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		gosqs.PeriodicTasks(time.Second, s.quit)
	}()
	running = s
	return s, nil
}

func serve(ln net.Listener, h http.Handler) *httptest.Server {
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	return srv
}

// Restart closes the endpoint's listener and every connection to it, waits down, and serves
// again on the same port, as a restarted SQS endpoint would: the queues and their messages
// stay as they were, and the visibility timeouts go on running meanwhile. Requests during the
// gap fail to connect. It returns once the endpoint serves again.
func (s *Server) Restart(down time.Duration) error {
	s.srvMu.Lock()
	defer s.srvMu.Unlock()
	addr := s.srv.Listener.Addr().String()
	handler := s.srv.Config.Handler
	s.srv.CloseClientConnections()
	s.srv.Close()
	time.Sleep(down)
	var ln net.Listener
	var err error
	for range 50 { // the port may take a moment to be free again
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("emulator: listen again on %s: %w", addr, err)
	}
	s.srv = serve(ln, handler)
	return nil
}

// Close stops the emulator and its expiry task.
func (s *Server) Close() {
	mu.Lock()
	defer mu.Unlock()
	close(s.quit)
	<-s.done
	s.srvMu.Lock()
	defer s.srvMu.Unlock()
	s.srv.CloseClientConnections()
	s.srv.Close()
	if running == s {
		running = nil
	}
}

// ErrNoQueue is the error of Counts and ExpireAll for a queue URL the emulator does not hold.
var ErrNoQueue = errors.New("no such queue")

// Counts returns how many messages the queue holds: visible ones and in-flight (received, not
// deleted) ones, read from goaws's state directly (exact, unlike the approximate queue
// attributes of real SQS).
func (s *Server) Counts(queueURL string) (visible, inFlight int, err error) {
	models.SyncQueues.RLock()
	defer models.SyncQueues.RUnlock()
	for _, q := range models.SyncQueues.Queues {
		if q.URL != queueURL {
			continue
		}
		for _, m := range q.Messages {
			if m.ReceiptHandle != "" {
				inFlight++
			} else {
				visible++
			}
		}
		return visible, inFlight, nil
	}
	return 0, 0, fmt.Errorf("emulator: %w: %s", ErrNoQueue, queueURL)
}

// ExpireAll makes every in-flight message of the queue visible again at goaws's next expiry
// check (within a second), as if the visibility timeout of a crashed consumer had run out.
func (s *Server) ExpireAll(queueURL string) error {
	models.SyncQueues.Lock()
	defer models.SyncQueues.Unlock()
	for _, q := range models.SyncQueues.Queues {
		if q.URL != queueURL {
			continue
		}
		past := time.Now().Add(-time.Second)
		for i := range q.Messages {
			if q.Messages[i].ReceiptHandle != "" {
				q.Messages[i].VisibilityTimeout = past
			}
		}
		return nil
	}
	return fmt.Errorf("emulator: %w: %s", ErrNoQueue, queueURL)
}

// CountsReply is the JSON body of the control handler's /counts answer.
type CountsReply struct {
	Visible  int `json:"visible"`
	InFlight int `json:"inFlight"`
}

// Control returns the HTTP handler that controls s, for a listener of its own (a restart of
// the SQS endpoint must not cut the control connection):
//
//	GET  /counts?queue=URL     CountsReply as JSON (Counts)
//	POST /expire?queue=URL     ExpireAll
//	POST /restart?down=1s      Restart, answered once the endpoint serves again
//	GET  /health               "ok"
//
// A queue that the emulator does not hold is a 404, another failure a 500, a bad request a
// 400; the body of a failure is its error's text.
func (s *Server) Control() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /counts", func(w http.ResponseWriter, r *http.Request) {
		vis, fl, err := s.Counts(r.URL.Query().Get("queue"))
		if err != nil {
			fail(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(CountsReply{Visible: vis, InFlight: fl})
	})
	mux.HandleFunc("POST /expire", func(w http.ResponseWriter, r *http.Request) {
		if err := s.ExpireAll(r.URL.Query().Get("queue")); err != nil {
			fail(w, err)
		}
	})
	mux.HandleFunc("POST /restart", func(w http.ResponseWriter, r *http.Request) {
		down, err := time.ParseDuration(r.URL.Query().Get("down"))
		if err != nil || down < 0 {
			http.Error(w, fmt.Sprintf("emulator: restart: bad down %q", r.URL.Query().Get("down")), http.StatusBadRequest)
			return
		}
		if err := s.Restart(down); err != nil {
			fail(w, err)
		}
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	return mux
}

func fail(w http.ResponseWriter, err error) {
	code := http.StatusInternalServerError
	if errors.Is(err, ErrNoQueue) {
		code = http.StatusNotFound
	}
	http.Error(w, err.Error(), code)
}
