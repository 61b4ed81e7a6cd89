package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/epochflow/epochflow/connectors/postgres"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/jackc/pgx/v5"
)

// The values of -target-exists: what a run without recovery state does with a target table
// that holds rows, which its initial copy would empty.
const (
	targetFail    = "fail"
	targetReplace = "replace"
)

// guarded reports whether a run refuses a target table with rows: when its initial copy
// would empty it, unless -target-exists replace allows that.
func (o options) guarded() bool { return o.copyExisting && o.targetExists != targetReplace }

// refuseFilled is the error for a target table with rows that a run without recovery state
// would empty: it names the table and the operator's choices.
func refuseFilled(table string, err error) error {
	return fmt.Errorf("%w; the initial copy of a run without recovery state would empty the table and refill it: "+
		"run with the -recovery directory of the run that wrote its rows, empty it yourself (TRUNCATE %s), "+
		"or pass -target-exists replace to let the copy replace them", err, table)
}

// checkFresh refuses, before anything is created, a first run (the slot does not exist yet)
// whose initial copy would empty a target table that holds rows. (A run whose slot exists may
// resume: the sink checks then, knowing whether it has resume state.)
func checkFresh(ctx context.Context, o options, src, tgt *pgx.Conn, ident string) error {
	if !o.guarded() {
		return nil
	}
	var slot bool
	if err := src.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1)", o.slot).Scan(&slot); err != nil {
		return fmt.Errorf("-source: looking up slot %q: %w", o.slot, err)
	}
	if slot {
		return nil
	}
	var full bool
	if err := tgt.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM "+ident+")").Scan(&full); err != nil {
		return fmt.Errorf("-target: checking table %s: %w", ident, err)
	}
	if !full {
		return nil
	}
	return refuseFilled(ident, fmt.Errorf("-target: table %s already holds rows, and this is a first run (slot %q does not exist yet)", ident, o.slot))
}

// targetSink is the Postgres sink with pg-cdc's flags in its NotEmptyError.
type targetSink struct{ *postgres.Sink }

// Build opens the partition, naming pg-cdc's choices when a table holds rows that no recovery
// state accounts for.
func (s targetSink) Build(ctx context.Context, part string, resume *uint64) (dataflow.StatefulSink[postgres.Row, uint64], error) {
	p, err := s.Sink.Build(ctx, part, resume)
	var ne *postgres.NotEmptyError
	if errors.As(err, &ne) {
		err = refuseFilled(ne.Table, err)
	}
	return p, err
}

// sink returns the flow's sink: RequireEmpty names the target table when -target-exists
// refuses a table with rows.
func sink(o options, ident string) dataflow.Sink[postgres.Row] {
	cfg := postgres.Config{DSN: o.target, Name: "pg-cdc:" + o.slot}
	if o.guarded() {
		cfg.RequireEmpty = []string{ident}
	}
	return dataflow.ToPartitioned[postgres.Row, uint64](targetSink{postgres.NewSink(cfg)})
}
