// Package postgres is an exactly-once sink into PostgreSQL tables, with two-phase commit.
//
//	sink := postgres.Rows(postgres.Config{DSN: "postgres://user:pass@host/db", Name: "orders.write"})
//	operators.Output("write", rows, sink) // rows: a dataflow.Stream[postgres.Row]
//
// A Row is an operation (Insert, Upsert, Update, Delete, Truncate) on a row of a table, given
// as column names and values; FromMap, FromStruct and FromChange (pgrepl change events) make
// them. Each table needs a key: its primary key, or the columns of a unique index named in
// Config.Keys. Values are converted to text for the column's type with pgx's type map (so the
// Go types pgx accepts for a column work, and a string is taken as the value's text form for
// any type), then cast by the server to the column's type without its modifier and assigned to
// the column, as an INSERT of the value would be: a value the column cannot hold (too long
// for varchar(5) or char(1), beyond numeric(5,2)) is refused, never cut to fit. A value that
// does not convert or that the column cannot hold, a column the table lacks, a missing table, a
// table without key, or a row without its key values fails the flow with an error naming the
// table, column and row (its key). When the server refuses one of the statements that write
// many rows at once, the sink replays the epoch's rows in a transaction of its own, rolled
// back, with savepoints, halving the refused statement's rows until it finds the row at fault
// (a few more round trips, on the failure path only).
//
// # Partitions, state, epochs and Commit
//
// The sink has Config.Partitions partitions (default 1), "p0", "p1", ...; a row goes to the
// partition of its table (a hash of Row.Table), so every table is written by one partition, in
// the order the rows reach it. Each partition has its own connection and writes each epoch in
// one transaction: Write only converts and keeps the rows; Snapshot, the pre-commit at the end
// of the epoch, writes them and prepares the transaction with
// PREPARE TRANSACTION 'epochflow:NAME:PART:SEQ', where SEQ counts the partition's snapshots and
// is its whole state (a uint64). If that fails, Snapshot returns the error and the epoch is
// never committed. Commit(seq), called once the epoch is committed, hands seq to the
// partition's committer goroutine, which runs COMMIT PREPARED for every prepared transaction
// up to seq on a connection of its own, so Commit returns at once; its failures come back from
// the next Write, Snapshot, Commit or Close. Close lets it finish the commits it was given.
//
// Within an epoch, the operations on one key collapse into one (an insert then updates become
// one insert; a delete then an insert an upsert; ...), and the rows of a table are written with
// one statement per operation and set of columns: inserts with COPY (text format), the
// others with their values passed as text arrays and unnested (INSERT ... SELECT ... FROM
// unnest($1::text[], ...) ON CONFLICT (key) DO UPDATE, UPDATE ... FROM unnest(...), DELETE ...
// USING unnest(...)): a few round trips per epoch, not one per row. (Rows whose effects cannot be merged flush what came before, so the effect is
// always that of applying the rows in order. Only the key is considered: constraints on other
// columns are checked as the collapsed statements run.)
//
// A prepared transaction keeps its row locks until COMMIT PREPARED. The next epoch's writes to
// the same rows would wait for those locks on the worker, which is also the goroutine that
// must call Commit to release them. So when an earlier prepared transaction of the partition is
// still waiting for its commit, Snapshot writes the epoch's rows (already converted to text)
// into the log table (Config.LogTable, created if missing) inside its prepared transaction
// instead, and the committer applies them to their tables, in order, in one transaction with
// their deletion from the log, right after COMMIT PREPARED. Once nothing waits, epochs write
// their tables directly again. Either way a row becomes visible only after its epoch commits.
//
// # Delivery and recovery
//
// Exactly once: Build with a resume state (the snapshot of the last committed epoch) finds
// the partition's prepared transactions in pg_prepared_xacts by their gid prefix, commits
// those of snapshots up to the resume state and rolls back the later ones (their epochs are
// replayed), then applies what the log holds of committed transactions. A fresh start (no
// resume state) refuses a table of Config.RequireEmpty that holds rows (NotEmptyError),
// changing nothing, not even the prepared transactions an earlier run left (they may be of
// epochs that the store of that run committed): rows that no recovery store accounts for are
// never overwritten by a flow that would replace them. Otherwise it rolls back every prepared
// transaction of the prefix (a table they hold locked is checked after that). The replayed epochs
// write their rows again into new transactions, so every row is written once.
//
// A connection lost to the target (the server restarted, fast or immediate, or the network
// failed) is replaced, with backoff, for up to Config.RetryFor (DefaultRetryFor), and the
// statement that noticed runs again: a Write's table lookup; a Snapshot's transaction, written
// again from the rows the partition still holds (the server rolled back the one it lost)
// unless its PREPARE TRANSACTION was done (found in pg_prepared_xacts by its gid); a COMMIT
// PREPARED by its gid (prepared transactions survive a restart; one gone after a lost answer
// was committed); the committer's application of logged rows, one transaction. Only when the
// server stays away longer does the partition fail, and the flow with it: its next run (or an
// in-process restart of the engine) resumes from the last committed epoch.
//
// # Running against a real server
//
// The server needs max_prepared_transactions above zero (Build fails with an error saying
// what to set otherwise): at least 10 per sink partition writing to it, since a partition holds
// one prepared transaction per uncommitted epoch (dataflow.Options.MaxEpochsInFlight, 4 by
// default) and, when its committer lags, up to 4 more whose COMMIT PREPARED is under way
// (Snapshot waits for the committer beyond that). The user needs
// INSERT, UPDATE, DELETE (and TRUNCATE for Truncate rows) on the tables, and CREATE on the
// schema of the log table the first time. Prepared transactions of a flow that is gone for
// good hold locks until someone resolves them: find them with
// SELECT gid FROM pg_prepared_xacts WHERE gid LIKE 'epochflow:NAME:%' and ROLLBACK PREPARED
// them. The tests start a throwaway PostgreSQL 15 cluster of their own (internal/pgtest),
// which needs the server binaries (Debian: apt-get install postgresql-15) and, as root, the
// postgres system user.
package postgres
