package windows_test

import (
	"context"
	"sync/atomic"

	"github.com/epochflow/epochflow/connectors/flowtest"
	"github.com/epochflow/epochflow/dataflow"
)

// gated wraps a flowtest source so that every partition yields nothing until the first epoch
// on its worker has ended (its first Snapshot). By then every other worker of the run, whose
// source has no partition and ended at once in its first epoch, has sent its end mark, and the
// windowed step takes no item of a later epoch before every upstream worker's first epoch is
// over: so the watermark an item meets does not depend on how fast the idle workers start.
type gated struct{ src *flowtest.Source[ev] }

func (g gated) Input() dataflow.Source[ev] { return dataflow.FromPartitioned[ev, flowtest.Position](g) }

func (g gated) Parts(ctx context.Context) ([]string, error) { return g.src.Parts(ctx) }

func (g gated) Build(ctx context.Context, part string, resume *flowtest.Position) (dataflow.StatefulSource[ev, flowtest.Position], error) {
	p, err := g.src.Build(ctx, part, resume)
	if err != nil {
		return nil, err
	}
	return &gatedPart{StatefulSource: p}, nil
}

type gatedPart struct {
	dataflow.StatefulSource[ev, flowtest.Position]
	open atomic.Bool
}

func (p *gatedPart) Next(ctx context.Context) ([]ev, error) {
	if !p.open.Load() {
		return nil, nil
	}
	return p.StatefulSource.Next(ctx)
}

func (p *gatedPart) Snapshot() flowtest.Position {
	p.open.Store(true)
	return p.StatefulSource.Snapshot()
}
