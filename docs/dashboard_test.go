package docs

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/recovery"
)

// dashboard is what the test reads of a Grafana dashboard.
type dashboard struct {
	Title      string `json:"title"`
	Templating struct {
		List []struct {
			Name  string `json:"name"`
			Query any    `json:"query"` // a string or {"query": ...}
		} `json:"list"`
	} `json:"templating"`
	Panels []struct {
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

var (
	// What is no metric name in a PromQL expression: label matchers, grouping labels, ranges,
	// strings, numbers.
	promNoise = regexp.MustCompile(`\{[^}]*\}|\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)|\[[^\]]*\]|"[^"]*"|\b\d+(\.\d+)?(e\d+)?\b`)
	// An identifier, and whether a call's parenthesis follows it.
	promIdent   = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	labelValues = regexp.MustCompile(`label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)`)
)

// promKeywords are PromQL words that are not metric names.
var promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "offset": true, "bool": true,
	"on": true, "ignoring": true, "group_left": true, "group_right": true}

// metricNames returns the metric names a PromQL expression reads.
func metricNames(expr string) []string {
	var out []string
	for _, m := range promIdent.FindAllString(promNoise.ReplaceAllString(expr, " "), -1) {
		if strings.HasSuffix(m, "(") || promKeywords[m] {
			continue
		}
		out = append(out, m)
	}
	return out
}

// The Grafana dashboard in docs/ parses, and its queries name only metrics that a real
// Monitor serves after a run (histograms by their _bucket, _sum and _count series), and every
// epochflow metric has a panel.
func TestGrafanaDashboardNamesServedMetrics(t *testing.T) {
	b, err := os.ReadFile("grafana-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("grafana-dashboard.json: %v", err)
	}
	families := servedFamilies(t)
	exists := func(name string) bool {
		if _, ok := families[name]; ok {
			return true
		}
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suffix); ok && families[base] == dto.MetricType_HISTOGRAM {
				return true
			}
		}
		return false
	}
	used := map[string]bool{}
	queries := 0
	for _, p := range d.Panels {
		for _, tg := range p.Targets {
			names := metricNames(tg.Expr)
			if len(names) == 0 {
				t.Errorf("panel %q: query %q names no metric", p.Title, tg.Expr)
			}
			for _, n := range names {
				queries++
				if !exists(n) {
					t.Errorf("panel %q: query %q names %s, which the Monitor does not serve", p.Title, tg.Expr, n)
				}
				used[n] = true
			}
		}
	}
	for _, v := range d.Templating.List {
		q, _ := v.Query.(string)
		if m, ok := v.Query.(map[string]any); ok {
			q, _ = m["query"].(string)
		}
		for _, m := range labelValues.FindAllStringSubmatch(q, -1) {
			if !exists(m[1]) {
				t.Errorf("variable %q: query %q names %s, which the Monitor does not serve", v.Name, q, m[1])
			}
		}
	}
	if queries == 0 {
		t.Fatal("no metric names found in the dashboard: the parsing is broken")
	}
	for name, typ := range families {
		if !strings.HasPrefix(name, "epochflow_") {
			continue
		}
		covered := used[name]
		if typ == dto.MetricType_HISTOGRAM {
			covered = covered || used[name+"_bucket"] || used[name+"_sum"] || used[name+"_count"]
		}
		if !covered {
			t.Errorf("no panel shows %s", name)
		}
	}
}

func TestMetricNames(t *testing.T) {
	got := metricNames(`histogram_quantile(0.99, sum by (le, step) (rate(a_b_bucket{job=~"$job", x="y(z"}[$__rate_interval]))) / on(instance) c 1e6`)
	if want := []string{"a_b_bucket", "c"}; !slices.Equal(got, want) {
		t.Fatalf("metricNames: %v, want %v", got, want)
	}
}

// servedFamilies runs a flow with a source that reports its lag, an exchange and a recovery
// store, and returns the metric families its Monitor serves, by name: while it runs (after its
// first commit; the exchange queues exist only then) and after it ended.
func servedFamilies(t *testing.T) map[string]dto.MetricType {
	mon := dataflow.NewMonitor()
	store, err := recovery.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "store"), recovery.SQLiteOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	f := dataflow.New("dash")
	src := &lagSource{n: 1000, release: make(chan struct{})}
	in := dataflow.Input(f, "read", dataflow.FromDynamic[int](src))
	dataflow.Output("write", dataflow.Redistribute("spread", in), dataflow.ToDynamic[int](discard{}))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- dataflow.Run(ctx, f, dataflow.Options{Workers: 2, EpochInterval: 5 * time.Millisecond, Monitor: mon, Recovery: store})
	}()
	out := map[string]dto.MetricType{}
	gather := func() {
		fams, err := mon.Gatherer().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, fam := range fams {
			out[fam.GetName()] = fam.GetType()
		}
	}
	for deadline := time.Now().Add(time.Minute); !mon.Ready(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the flow committed no epoch in a minute")
		}
	}
	gather()
	close(src.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	gather()
	return out
}

// lagSource reads n items on each worker, reporting how many are left as its lag, and ends
// once release is closed.
type lagSource struct {
	n       int
	release chan struct{}
}

type lagPart struct {
	hook    dataflow.MetricsHook
	left    int
	release chan struct{}
}

func (s *lagSource) Build(ctx context.Context, _ dataflow.Worker) (dataflow.WorkerSource[int], error) {
	return &lagPart{hook: dataflow.Metrics(ctx), left: s.n, release: s.release}, nil
}

func (p *lagPart) Next(context.Context) ([]int, error) {
	if p.left == 0 {
		select {
		case <-p.release:
			return nil, io.EOF
		default:
			return nil, nil
		}
	}
	k := min(p.left, 100)
	p.left -= k
	p.hook.SourceLag("p", float64(p.left))
	return make([]int, k), nil
}

func (p *lagPart) Close() error { return nil }

type discard struct{}

func (discard) Build(context.Context, dataflow.Worker) (dataflow.WorkerSink[int], error) {
	return discard{}, nil
}
func (discard) Write(context.Context, []int) error { return nil }
func (discard) Close() error                       { return nil }
