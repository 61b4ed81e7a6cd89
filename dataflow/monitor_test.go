package dataflow

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"go.uber.org/goleak"

	"github.com/epochflow/epochflow/recovery"
)

// lockedBuffer is a bytes.Buffer that several goroutines may write (the logger's).
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// heldSource is read by worker 0 only: its Build waits for gate, then it emits n items in
// batches of 100, reports its lag (the items not yet emitted) through Metrics, and ends when
// release is closed.
type heldSource struct {
	n             int
	gate, release chan struct{}
}

type heldPart struct {
	s    *heldSource
	hook MetricsHook
	sent int
	me   bool
}

func (s *heldSource) Build(ctx context.Context, w Worker) (WorkerSource[int], error) {
	select {
	case <-s.gate:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	p := &heldPart{s: s, hook: Metrics(ctx), me: w.Index == 0}
	if p.me {
		p.hook.SourceLag("p0", float64(s.n))
	}
	return p, nil
}

func (p *heldPart) Next(context.Context) ([]int, error) {
	if p.me && p.sent < p.s.n {
		k := min(100, p.s.n-p.sent)
		b := make([]int, k)
		for i := range b {
			b[i] = p.sent + i
		}
		p.sent += k
		p.hook.SourceLag("p0", float64(p.s.n-p.sent))
		return b, nil
	}
	select {
	case <-p.s.release:
		return nil, io.EOF
	default:
		return nil, nil
	}
}

func (p *heldPart) Wait() <-chan struct{} { return p.s.release }
func (p *heldPart) Close() error          { return nil }

// A flow run through mainFunc with -metrics-addr 127.0.0.1:0 logs the address it serves;
// /readyz answers 503 while the sources are being built, 200 once an epoch is committed;
// /metrics holds every epochflow family with its type and labels, items_in_total of the
// source equals the items fed, and epoch_committed grows; /dataflow lists every step; and the
// server is gone when mainFunc returns.
func TestMainServesMetrics(t *testing.T) {
	defer goleak.VerifyNone(t)
	const items = 2500
	src := &heldSource{n: items, gate: make(chan struct{}), release: make(chan struct{})}
	flow := func() (*Flow, error) {
		f := New("mon")
		in := Input(f, "read", FromDynamic[int](src))
		kv := Transform("key", in, func(b []int) ([]KV[int], error) {
			out := make([]KV[int], len(b))
			for i, v := range b {
				out[i] = KV[int]{Key: strconv.Itoa(v % 50), Value: v}
			}
			return out, nil
		})
		st := Stateful("sum", kv, StatefulLogic[int, int, int]{
			OnItem: func(_ string, s *int, _ bool, v int, e *Emitter[int]) (bool, error) {
				*s += v
				e.Emit(*s)
				return true, nil
			}})
		Output("write", st, ToDynamic[KV[int]](noSink{}))
		return f, nil
	}
	var stderr lockedBuffer
	code := make(chan int, 1)
	go func() {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		code <- mainFunc(fs, []string{"-workers", "2", "-epoch-interval", "20ms", "-recovery", t.TempDir(),
			"-metrics-addr", "127.0.0.1:0"}, io.Discard, &stderr, flow)
	}()
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	var get func(path string) (int, []byte, error)
	deadline := time.Now().Add(60 * time.Second)
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for !ok() {
			if time.Now().After(deadline) {
				close(src.gate)
				close(src.release)
				t.Fatalf("timed out waiting for %s; stderr:\n%s", what, stderr.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	addrRe := regexp.MustCompile(`msg="serving metrics" addr=(\S+)`)
	var base string
	waitFor("the logged address", func() bool {
		m := addrRe.FindStringSubmatch(stderr.String())
		if m != nil {
			base = "http://" + m[1]
		}
		return m != nil
	})
	get = func(path string) (int, []byte, error) {
		resp, err := client.Get(base + path)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		return resp.StatusCode, body, err
	}
	mustGet := func(path string) (int, []byte) {
		t.Helper()
		c, b, err := get(path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		return c, b
	}

	// The source's Build is held: alive, not ready.
	if c, b := mustGet("/livez"); c != 200 {
		t.Errorf("/livez: %d %s", c, b)
	}
	if c, b := mustGet("/debug/pprof/"); c != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without -pprof: %d %.200s; want 404", c, b)
	}
	if c, b := mustGet("/readyz"); c != http.StatusServiceUnavailable {
		t.Errorf("/readyz while the sources are built: %d %s; want 503", c, b)
	}
	c, b := mustGet("/dataflow")
	var d Description
	if err := json.Unmarshal(b, &d); c != 200 || err != nil {
		t.Fatalf("/dataflow: %d %v %s", c, err, b)
	}
	want := map[string]string{"mon.read": "source", "mon.key": "transform", "mon.sum": "stateful", "mon.write": "sink"}
	for _, s := range d.Steps {
		if want[s.ID] != s.Kind {
			t.Errorf("/dataflow: step %q of kind %q; want %v", s.ID, s.Kind, want)
		}
		delete(want, s.ID)
	}
	if len(want) > 0 || d.Flow != "mon" {
		t.Errorf("/dataflow of flow %q lacks %v: %s", d.Flow, want, b)
	}
	exchanges := 0
	for _, e := range d.Edges {
		if e.Exchange {
			exchanges++
			if e.From != "mon.key" || e.To != "mon.sum" {
				t.Errorf("/dataflow: exchange %+v; want only mon.key -> mon.sum", e)
			}
		}
	}
	if len(d.Edges) != 3 || exchanges != 1 {
		t.Errorf("/dataflow: edges %+v; want 3, 1 exchange", d.Edges)
	}

	close(src.gate)
	waitFor("/readyz 200", func() bool { c, _, err := get("/readyz"); return err == nil && c == 200 })

	scrape := func() map[string]*dto.MetricFamily {
		t.Helper()
		c, b := mustGet("/metrics")
		if c != 200 {
			t.Fatalf("/metrics: %d %s", c, b)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("/metrics does not parse: %v\n%s", err, b)
		}
		return fams
	}
	value := func(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
		v := 0.0
		for _, m := range fams[name].GetMetric() {
			match := true
			for _, l := range m.GetLabel() {
				if want, ok := labels[l.GetName()]; ok && want != l.GetValue() {
					match = false
				}
			}
			if match {
				v += m.GetCounter().GetValue() + m.GetGauge().GetValue()
			}
		}
		return v
	}
	var fams map[string]*dto.MetricFamily
	waitFor("items_in_total of mon.read to reach the items fed", func() bool {
		fams = scrape()
		return value(fams, "epochflow_items_in_total", map[string]string{"step": "mon.read"}) >= items
	})
	if v := value(fams, "epochflow_items_in_total", map[string]string{"step": "mon.read"}); v != items {
		t.Errorf("items_in_total{step=mon.read} = %v; want %d", v, items)
	}
	for _, f := range []struct {
		name   string
		typ    dto.MetricType
		labels []string
	}{
		{"epochflow_items_in_total", dto.MetricType_COUNTER, []string{"step", "worker"}},
		{"epochflow_items_out_total", dto.MetricType_COUNTER, []string{"step", "worker"}},
		{"epochflow_epoch_open", dto.MetricType_GAUGE, nil},
		{"epochflow_epoch_committed", dto.MetricType_GAUGE, nil},
		{"epochflow_commit_duration_seconds", dto.MetricType_HISTOGRAM, nil},
		{"epochflow_snapshot_duration_seconds", dto.MetricType_HISTOGRAM, nil},
		{"epochflow_snapshot_bytes", dto.MetricType_HISTOGRAM, nil},
		{"epochflow_exchange_queue_depth", dto.MetricType_GAUGE, []string{"edge", "worker"}},
		{"epochflow_source_lag", dto.MetricType_GAUGE, []string{"partition", "step"}},
		{"epochflow_late_items_total", dto.MetricType_COUNTER, nil},
		{"epochflow_restarts_total", dto.MetricType_COUNTER, nil},
		{"epochflow_errors_total", dto.MetricType_COUNTER, nil},
		{"go_goroutines", dto.MetricType_GAUGE, nil},
		{"process_cpu_seconds_total", dto.MetricType_COUNTER, nil},
	} {
		fam := fams[f.name]
		if fam == nil || fam.GetType() != f.typ || len(fam.GetMetric()) == 0 {
			t.Errorf("family %s: %v; want type %v with a metric", f.name, fam, f.typ)
			continue
		}
		for _, m := range fam.GetMetric() {
			var names []string
			for _, l := range m.GetLabel() {
				names = append(names, l.GetName())
			}
			if fmt.Sprint(names) != fmt.Sprint(f.labels) && !(len(names) == 0 && f.labels == nil) {
				t.Errorf("family %s has labels %v; want %v", f.name, names, f.labels)
			}
		}
	}
	if v := value(fams, "epochflow_items_in_total", map[string]string{"step": "mon.sum"}); v > items {
		t.Errorf("items_in_total{step=mon.sum} = %v; want at most %d", v, items)
	}
	if v := value(fams, "epochflow_source_lag", map[string]string{"step": "mon.read", "partition": "p0"}); v != 0 {
		t.Errorf("source_lag of mon.read p0 = %v after every item was read; want 0", v)
	}
	if n := len(fams["epochflow_exchange_queue_depth"].GetMetric()); n != 2 {
		t.Errorf("exchange_queue_depth has %d series; want 2 (one edge, 2 workers)", n)
	}
	if fams["epochflow_commit_duration_seconds"].GetMetric()[0].GetHistogram().GetSampleCount() == 0 {
		t.Errorf("commit_duration_seconds has no sample after a commit")
	}
	first := value(fams, "epochflow_epoch_committed", nil)
	if first < 1 {
		t.Errorf("epoch_committed = %v once ready; want at least 1", first)
	}
	waitFor("epoch_committed to grow", func() bool { return value(scrape(), "epochflow_epoch_committed", nil) > first })

	close(src.release)
	select {
	case c := <-code:
		if c != 0 {
			t.Fatalf("exit %d; stderr:\n%s", c, stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the flow did not end; stderr:\n%s", stderr.String())
	}
	if _, _, err := get("/livez"); err == nil {
		t.Errorf("the metrics server still answers after mainFunc returned")
	}
}

// With -pprof, the metrics server also serves the Go profiles at /debug/pprof/ (without it,
// 404: see TestMainServesMetrics).
func TestMainServesPprof(t *testing.T) {
	defer goleak.VerifyNone(t)
	src := &heldSource{n: 10, gate: make(chan struct{}), release: make(chan struct{})}
	var stderr lockedBuffer
	code := make(chan int, 1)
	go func() {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		code <- mainFunc(fs, []string{"-metrics-addr", "127.0.0.1:0", "-pprof"}, io.Discard, &stderr, func() (*Flow, error) {
			f := New("prof")
			Output("out", Input(f, "in", FromDynamic[int](src)), ToDynamic[int](discardInts{}))
			return f, nil
		})
	}()
	defer func() {
		close(src.release)
		select {
		case <-src.gate:
		default:
			close(src.gate)
		}
		if c := <-code; c != 0 {
			t.Errorf("exit %d; stderr:\n%s", c, stderr.String())
		}
	}()
	addrRe := regexp.MustCompile(`msg="serving metrics" addr=(\S+) \S+ pprof=true`)
	deadline := time.Now().Add(time.Minute)
	var m []string
	for m = addrRe.FindStringSubmatch(stderr.String()); m == nil; m = addrRe.FindStringSubmatch(stderr.String()) {
		if time.Now().After(deadline) {
			t.Fatalf("no address logged with pprof=true within a minute; stderr:\n%s", stderr.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	for path, want := range map[string]string{"/debug/pprof/": "goroutine", "/debug/pprof/goroutine?debug=1": "goroutine profile: total"} {
		resp, err := client.Get("http://" + m[1] + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || !strings.Contains(string(b), want) {
			t.Errorf("GET %s with -pprof: %d %v %.200q; want 200 with %q", path, resp.StatusCode, err, b, want)
		}
	}
}

// A Monitor counts across the attempts of a restarted run: the failure is an error and a
// restart, the items read by both attempts add up, every commit is observed with its
// snapshot, and the run is not ready once it has ended.
func TestMonitorCountsRestarts(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	store, err := recovery.OpenSQLite(ctx, t.TempDir(), recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	var failed atomic.Bool
	f := New("retry")
	Output("out", Input(f, "in", FromDynamic[int](oneBatch{})), ToDynamic[int](failOnce{&failed}))
	mon := NewMonitor()
	st, err := RunStats(ctx, f, Options{Recovery: store, Monitor: mon, EpochInterval: 5 * time.Millisecond,
		Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
		Restart: RestartPolicy{Attempts: 3, Backoff: 5 * time.Millisecond}})
	if err != nil || st.Restarts != 1 {
		t.Fatalf("RunStats: %+v, %v; want 1 restart and no error", st, err)
	}
	fams, err := mon.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, fam := range fams {
		for _, m := range fam.GetMetric() {
			name := fam.GetName()
			for _, l := range m.GetLabel() {
				if l.GetName() == "step" {
					name += "{" + l.GetValue() + "}"
				}
			}
			got[name] += m.GetCounter().GetValue() + m.GetGauge().GetValue() + float64(m.GetHistogram().GetSampleCount())
		}
	}
	for name, want := range map[string]float64{
		"epochflow_restarts_total": 1, "epochflow_errors_total": 1,
		"epochflow_items_in_total{retry.in}": 6, "epochflow_items_out_total{retry.out}": 6,
		"epochflow_epoch_committed": float64(st.Committed),
	} {
		if got[name] != want {
			t.Errorf("%s = %v; want %v (all: %v)", name, got[name], want, got)
		}
	}
	if got["epochflow_snapshot_duration_seconds"] == 0 || got["epochflow_snapshot_bytes"] == 0 ||
		got["epochflow_commit_duration_seconds"] == 0 {
		t.Errorf("no commit observed: %v", got)
	}
	if mon.Ready() {
		t.Errorf("Ready after the run ended")
	}
}

// restartSource is read by one worker. Its Next fails once when failNow is closed, as a
// source whose broker went away would; the Build of the second attempt says so on building
// and waits for rebuild. Each Build reports a lag of n on partition "attemptN". It ends when
// end is closed.
type restartSource struct {
	attempts                        atomic.Int32
	failed                          atomic.Bool
	failNow, building, rebuild, end chan struct{}
}

func (s *restartSource) Build(ctx context.Context, _ Worker) (WorkerSource[int], error) {
	n := s.attempts.Add(1)
	if n == 2 {
		close(s.building)
		select {
		case <-s.rebuild:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	Metrics(ctx).SourceLag(fmt.Sprintf("attempt%d", n), float64(n))
	return s, nil
}

func (s *restartSource) Next(context.Context) ([]int, error) {
	select {
	case <-s.failNow:
		if s.failed.CompareAndSwap(false, true) {
			return nil, errors.New("the broker went away")
		}
	default:
	}
	select {
	case <-s.end:
		return nil, io.EOF
	default:
		return nil, nil
	}
}

func (*restartSource) Close() error { return nil }

// discardInts is a sink that drops what it is given.
type discardInts struct{}

func (discardInts) Build(context.Context, Worker) (WorkerSink[int], error) { return discardInts{}, nil }
func (discardInts) Write(context.Context, []int) error                     { return nil }
func (discardInts) Close() error                                           { return nil }

// lagSeries returns the partitions of step's epochflow_source_lag series with their values.
func lagSeries(t *testing.T, m *Monitor, step string) map[string]float64 {
	t.Helper()
	fams, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, fam := range fams {
		if fam.GetName() != "epochflow_source_lag" {
			continue
		}
		for _, g := range fam.GetMetric() {
			labels := map[string]string{}
			for _, l := range g.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["step"] == step {
				got[labels["partition"]] = g.GetGauge().GetValue()
			}
		}
	}
	return got
}

// A flow that fails while it runs is not ready (/readyz 503) from its failure, through the
// wait before its restart and its resume, until its restarted attempt commits an epoch; then
// it is ready again. The lag its source reported before the failure is not served after it.
func TestMonitorNotReadyWhileRestarting(t *testing.T) {
	defer goleak.VerifyNone(t)
	ctx := context.Background()
	store, err := recovery.OpenSQLite(ctx, t.TempDir(), recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	src := &restartSource{failNow: make(chan struct{}), building: make(chan struct{}),
		rebuild: make(chan struct{}), end: make(chan struct{})}
	f := New("restarting")
	Output("out", Input(f, "in", FromDynamic[int](src)), ToDynamic[int](discardInts{}))
	mon := NewMonitor()
	h := mon.Handler(f, false)
	readyz := func() int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		return rec.Code
	}
	readyAtRestart := make(chan bool, 1)
	type result struct {
		st  Stats
		err error
	}
	done := make(chan result, 1)
	go func() {
		st, err := RunStats(ctx, f, Options{Recovery: store, Monitor: mon, EpochInterval: 5 * time.Millisecond,
			Logger:  slog.New(slog.NewTextHandler(io.Discard, nil)),
			Restart: RestartPolicy{Attempts: 3, Backoff: 5 * time.Millisecond},
			OnRestart: func(RestartEvent) {
				select {
				case readyAtRestart <- mon.Ready():
				default:
				}
			}})
		done <- result{st, err}
	}()
	// Unblock everything if the test ends early, so the run's goroutines end.
	defer func() {
		for _, ch := range []chan struct{}{src.failNow, src.rebuild, src.end} {
			select {
			case <-ch:
			default:
				close(ch)
			}
		}
		<-done
	}()
	deadline := time.Now().Add(time.Minute)
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(time.Millisecond)
		}
	}
	committed := func() uint64 {
		_, meter := mon.current()
		return meter.Committed()
	}

	waitFor("the first attempt to be ready", func() bool { return mon.Ready() && readyz() == http.StatusOK })
	if lag := lagSeries(t, mon, "restarting.in"); len(lag) != 1 || lag["attempt1"] != 1 {
		t.Errorf("source_lag of the first attempt: %v; want attempt1=1", lag)
	}
	before := committed()
	close(src.failNow)
	select {
	case <-src.building:
	case r := <-done:
		done <- r
		t.Fatalf("the run ended instead of restarting: %+v, %v", r.st, r.err)
	case <-time.After(time.Minute):
		t.Fatal("the restarted attempt did not build its source within a minute")
	}
	if ready := <-readyAtRestart; ready {
		t.Errorf("Ready during the wait before the restart")
	}
	if mon.Ready() || readyz() != http.StatusServiceUnavailable {
		t.Errorf("while the restarted attempt builds its source: Ready %v, /readyz %d; want false, 503", mon.Ready(), readyz())
	}
	if lag := lagSeries(t, mon, "restarting.in"); len(lag) != 0 {
		t.Errorf("source_lag while the restarted attempt builds its source: %v; want no series (the failed attempt's are stale)", lag)
	}

	close(src.rebuild)
	waitFor("the restarted attempt to be ready", func() bool { return mon.Ready() && readyz() == http.StatusOK })
	if after := committed(); after <= before {
		t.Errorf("ready again with epoch %d committed; want a commit after %d", after, before)
	}
	if lag := lagSeries(t, mon, "restarting.in"); len(lag) != 1 || lag["attempt2"] != 2 {
		t.Errorf("source_lag of the restarted attempt: %v; want only attempt2=2", lag)
	}
	close(src.end)
	r := <-done
	done <- r
	if r.err != nil || r.st.Restarts != 1 {
		t.Fatalf("RunStats: %+v, %v; want 1 restart and no error", r.st, r.err)
	}
	if mon.Ready() || readyz() != http.StatusServiceUnavailable {
		t.Errorf("after the run ended: Ready %v, /readyz %d; want false, 503", mon.Ready(), readyz())
	}
}

// registeringSource is a connector with metrics of its own: every Build registers
// epochflow_testconn_builds_total and epochflow_testconn_items_total through the hook's
// Registerer, using the existing collectors on a prometheus.AlreadyRegisteredError as
// MetricsHook advises (already counts those), and each worker reads 5 items.
type registeringSource struct{ already *atomic.Int32 }

type registeringPart struct {
	items prometheus.Counter
	done  bool
}

// registerOnce registers c, or returns the collector registered before it under its name.
func (s registeringSource) registerOnce(reg prometheus.Registerer, c prometheus.Counter) (prometheus.Counter, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		s.already.Add(1)
		return are.ExistingCollector.(prometheus.Counter), nil
	}
	return c, err
}

func (s registeringSource) Build(ctx context.Context, _ Worker) (WorkerSource[int], error) {
	reg := Metrics(ctx).Registerer()
	builds, err := s.registerOnce(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "epochflow_testconn_builds_total", Help: "Builds of the test connector."}))
	if err != nil {
		return nil, err
	}
	items, err := s.registerOnce(reg, prometheus.NewCounter(prometheus.CounterOpts{
		Name: "epochflow_testconn_items_total", Help: "Items the test connector read."}))
	if err != nil {
		return nil, err
	}
	builds.Inc()
	return &registeringPart{items: items}, nil
}

func (p *registeringPart) Next(context.Context) ([]int, error) {
	if p.done {
		return nil, io.EOF
	}
	p.done = true
	p.items.Add(5)
	return []int{1, 2, 3, 4, 5}, nil
}

func (*registeringPart) Close() error { return nil }

// A connector's own metrics, registered through MetricsHook.Registerer from Build on 2
// workers, are served at /metrics with the epochflow ones; a second run with the same
// Monitor builds them again, gets prometheus.AlreadyRegisteredError, and counts on in the
// existing collectors. Without a Monitor the Registerer accepts them and serves nothing.
func TestConnectorRegistersItsOwnMetrics(t *testing.T) {
	defer goleak.VerifyNone(t)
	var already atomic.Int32
	f := New("conn")
	in := Input(f, "in", FromDynamic[int](registeringSource{&already}))
	Output("out", in, ToDynamic[int](discardInts{}))
	mon := NewMonitor()
	h := mon.Handler(f, false)
	scrape := func() map[string]*dto.MetricFamily {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if rec.Code != http.StatusOK {
			t.Fatalf("/metrics: %d %s", rec.Code, rec.Body)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		fams, err := parser.TextToMetricFamilies(rec.Body)
		if err != nil {
			t.Fatalf("/metrics does not parse: %v", err)
		}
		return fams
	}
	counter := func(fams map[string]*dto.MetricFamily, name string) float64 {
		t.Helper()
		fam := fams[name]
		if fam == nil || fam.GetType() != dto.MetricType_COUNTER || len(fam.GetMetric()) != 1 {
			t.Fatalf("/metrics: family %s is %v; want one counter", name, fam)
		}
		return fam.GetMetric()[0].GetCounter().GetValue()
	}
	opts := Options{Workers: 2, Monitor: mon, EpochInterval: 5 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for run, want := range []struct{ builds, items, already float64 }{{2, 10, 1}, {4, 20, 3}} {
		if err := Run(context.Background(), f, opts); err != nil {
			t.Fatalf("run %d: %v", run+1, err)
		}
		fams := scrape()
		builds, items := counter(fams, "epochflow_testconn_builds_total"), counter(fams, "epochflow_testconn_items_total")
		if builds != want.builds || items != want.items || float64(already.Load()) != want.already*2 {
			t.Errorf("after run %d: builds %v, items %v, %d AlreadyRegisteredErrors; want %v, %v, %v",
				run+1, builds, items, already.Load(), want.builds, want.items, want.already*2)
		}
		if _, ok := fams["epochflow_items_in_total"]; !ok {
			t.Errorf("after run %d: /metrics lacks the epochflow metrics", run+1)
		}
	}

	already.Store(0)
	opts.Monitor = nil
	if err := Run(context.Background(), f, opts); err != nil || already.Load() != 0 {
		t.Errorf("without a Monitor: %v, %d AlreadyRegisteredErrors; want no error and none", err, already.Load())
	}
}
