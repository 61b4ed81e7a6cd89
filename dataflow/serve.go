package dataflow

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Handler serves the monitor of a run of flow over HTTP:
//
//	/metrics        the metrics, in the Prometheus text format (see Monitor)
//	/livez          200 while the process runs
//	/readyz         200 once the sources are built and an epoch is committed, 503 before,
//	                while the flow restarts after a failure, and once it has ended (Monitor.Ready)
//	/dataflow       the flow's graph as JSON (see Description)
//	/debug/pprof/   the Go profiles, only when withPprof is true
func (m *Monitor) Handler(flow *Flow, withPprof bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg}))
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !m.Ready() {
			http.Error(w, "not ready: the flow is starting, resuming, restarting or has ended, "+
				"and has not committed an epoch since", http.StatusServiceUnavailable)
			return
		}
		w.Write([]byte("ok\n"))
	})
	desc := flow.Describe()
	mux.HandleFunc("/dataflow", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(desc)
	})
	if withPprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// monitorServer is the HTTP server of -metrics-addr.
type monitorServer struct {
	addr string // the address it listens on (with the port picked, for port 0)
	srv  *http.Server
	done chan struct{}
}

// serveMonitor listens on addr and serves h until stop.
func serveMonitor(addr string, h http.Handler) (*monitorServer, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &monitorServer{addr: ln.Addr().String(), done: make(chan struct{}),
		srv: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}}
	go func() {
		defer close(s.done)
		s.srv.Serve(ln) // returns http.ErrServerClosed on stop
	}()
	return s, nil
}

// stop closes the listener, lets the requests being served finish (for a second at most),
// closes every connection, and returns once the server's goroutine has.
func (s *monitorServer) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if s.srv.Shutdown(ctx) != nil {
		s.srv.Close()
	}
	<-s.done
}
