package spool

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// Message is one file of the spool directory.
type Message struct {
	Name string // the file's name in the directory
	Body []byte // its contents
}

// SourceConfig says which directory Read reads and how.
type SourceConfig struct {
	// Dir is the spool directory. It must exist.
	Dir string
	// Poll is how long the source waits before it lists the directory again after finding
	// nothing new; 0 means 100 ms.
	Poll time.Duration
	// IdleExit, when positive, ends the source once it has found nothing new for that long.
	// Zero reads until the flow is stopped.
	IdleExit time.Duration
	// MaxBatch is the most files one Next reads; 0 means 256.
	MaxBatch int
}

// Read returns a source that emits the files of cfg.Dir in name order, skipping names that
// start with a dot (files still being written), and deletes each file once the epoch that
// read it is committed.
func Read(cfg SourceConfig) dataflow.Source[Message] {
	return dataflow.FromPartitioned[Message, string](&source{cfg: cfg})
}

// source is the dataflow.PartitionedSource behind Read.
type source struct{ cfg SourceConfig }

// Parts returns the one partition: the directory's absolute path (so that the state of a
// resumed run is that of the same directory).
func (s *source) Parts(context.Context) ([]string, error) {
	if s.cfg.Dir == "" {
		return nil, errors.New("spool source: SourceConfig.Dir is empty")
	}
	abs, err := filepath.Abs(s.cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("spool source: %w", err)
	}
	if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
		return nil, fmt.Errorf("spool source: %s is not a directory (SourceConfig.Dir)", abs)
	}
	return []string{abs}, nil
}

// Build opens the partition. resume is the name of the last file a committed epoch emitted:
// the files up to it were processed (Commit deletes those still there), and reading goes on
// after it.
func (s *source) Build(ctx context.Context, part string, resume *string) (dataflow.StatefulSource[Message, string], error) {
	p := &partition{dir: part, cfg: s.cfg, lastNew: time.Now(), done: make(chan struct{}), exited: make(chan struct{})}
	if p.cfg.Poll <= 0 {
		p.cfg.Poll = 100 * time.Millisecond
	}
	if p.cfg.MaxBatch <= 0 {
		p.cfg.MaxBatch = 256
	}
	if resume != nil {
		p.last = *resume
	}
	// The lag is counted on a goroutine of its own, so that it is reported also while the
	// worker is busy downstream and does not call Next. The run's context bounds it too: a
	// run that ends without Close (a crash) must leave no goroutine behind.
	go p.reportLag(ctx, dataflow.Metrics(ctx))
	return p, nil
}

// reportLag reports the files in the directory, read or not (a read one is deleted at its
// commit), as the partition's epochflow_source_lag every Poll, until Close or the end of the
// run.
func (p *partition) reportLag(ctx context.Context, metrics dataflow.MetricsHook) {
	defer close(p.exited)
	t := time.NewTicker(p.cfg.Poll)
	defer t.Stop()
	for {
		if names, err := p.names(); err == nil {
			metrics.SourceLag(p.dir, float64(len(names)))
		}
		select {
		case <-t.C:
		case <-p.done:
			return
		case <-ctx.Done():
			return
		}
	}
}

// partition is the open source. The engine calls its methods from one goroutine.
type partition struct {
	dir          string
	cfg          SourceConfig
	done, exited chan struct{} // Close stops reportLag; it has returned

	last    string    // the name of the last file Next emitted
	wake    time.Time // when Next is worth calling again (Awaker)
	lastNew time.Time // when Next last found a new file (IdleExit)
}

// names lists the message files of the directory, in name order.
func (p *partition) names() ([]string, error) {
	entries, err := os.ReadDir(p.dir) // sorted by name
	if err != nil {
		return nil, fmt.Errorf("spool source %s: %w", p.dir, err)
	}
	var out []string
	for _, e := range entries {
		if e.Type().IsRegular() && !strings.HasPrefix(e.Name(), ".") {
			out = append(out, e.Name())
		}
	}
	return out, nil
}

// Next reads the files after the last one emitted, up to MaxBatch of them. With nothing new it
// returns an empty batch and asks to be called again after Poll (NextAwake), or io.EOF once
// IdleExit has passed.
func (p *partition) Next(context.Context) ([]Message, error) {
	names, err := p.names()
	if err != nil {
		return nil, err
	}
	// The files up to last are read (their deletion waits for their commit); the rest wait.
	i, _ := slices.BinarySearch(names, p.last)
	if i < len(names) && names[i] == p.last {
		i++
	}
	waiting := names[i:]
	batch := waiting[:min(len(waiting), p.cfg.MaxBatch)]
	out := make([]Message, 0, len(batch))
	for _, name := range batch {
		body, err := os.ReadFile(filepath.Join(p.dir, name))
		if err != nil {
			return nil, fmt.Errorf("spool source %s: %w", p.dir, err)
		}
		out = append(out, Message{Name: name, Body: body})
		p.last = name
	}
	now := time.Now()
	if len(out) > 0 {
		p.lastNew, p.wake = now, time.Time{}
		return out, nil
	}
	if p.cfg.IdleExit > 0 && now.Sub(p.lastNew) >= p.cfg.IdleExit {
		return nil, io.EOF
	}
	p.wake = now.Add(p.cfg.Poll)
	return nil, nil
}

// NextAwake tells the engine when to call Next again (dataflow.Awaker): at once after a batch,
// after Poll when the directory had nothing new.
func (p *partition) NextAwake() time.Time { return p.wake }

// Snapshot returns the name of the last file emitted: after a crash, reading resumes after it.
func (p *partition) Snapshot() string { return p.last }

// Commit deletes the files up to last, the name a committed epoch's Snapshot returned: they
// are processed and written for good. It may be called again with the same name (after a
// resume), so a file already gone is no error.
func (p *partition) Commit(_ context.Context, last string) error {
	names, err := p.names()
	if err != nil {
		return err
	}
	for _, name := range names {
		if name > last {
			break
		}
		if err := os.Remove(filepath.Join(p.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("spool source %s: deleting %s after its commit: %w", p.dir, name, err)
		}
	}
	return nil
}

// Close stops the lag's goroutine and waits for it; the files need nothing: every call opens
// and closes its own.
func (p *partition) Close() error {
	close(p.done)
	<-p.exited
	return nil
}
