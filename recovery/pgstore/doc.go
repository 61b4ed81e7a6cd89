// Package pgstore is a recovery.Store on PostgreSQL: the recovery store of a flow kept in a
// database that every process of a cluster can reach, so that a process restarted on another
// machine resumes from it. It keeps exactly the contract of recovery.Store (recovery/store.go),
// which the tests check with the suite of recovery/storetest, as the SQLite store's do.
//
// # What the database holds
//
// A store is a PostgreSQL schema (Options.Schema, or the DSN URL's schema=NAME parameter;
// "epochflow" by default) with seven tables, so that several flows can share a database, each
// in a schema of its own:
//
//   - meta: the layout's version (SchemaVersion; Open refuses another with an error wrapping
//     recovery.ErrSchemaVersion) and the garbage-collection horizon;
//   - executions: one row per Begin (its flow, steps, workers, start time);
//   - frontiers: each worker's frontier at its execution's last commit;
//   - commits: the committed epochs still inside the backup window, and the last one;
//   - runs and chunks: the snapshots. Each Commit writes, per step it has snapshots of, one
//     run: the step's snapshots sorted by key and epoch, encoded compactly (keys
//     prefix-compressed, as the SQLite store encodes them) into chunks of about 256 KiB, each
//     chunk one row of chunks (its run, position, entry count, CRC-32C and bytes; the bytes
//     stored uncompressed, out of line: they are compact already), sent with COPY. A commit
//     of a million keys is some 80 rows, not a million, and BenchmarkCommit measures it
//     about as fast as the SQLite store's (1.05 times its 0.84 s for a million keys, with
//     fsync on; 1.4 to 1.6 times its 3 ms for 1,000 keys, a dozen round trips), and
//     BenchmarkLoad a resume of a million keys 0.75 to 0.84 times its time. A run's row records its entry and chunk
//     counts, its bytes and the sum of its chunks' checksums;
//   - step_sums: per step, the entry count and checksum sum over its runs.
//
// Epochs and frontiers (uint64) are stored as the bigint with the same bits; times as Unix
// nanoseconds.
//
// # Transactions and garbage collection
//
// Commit is one PostgreSQL transaction (the commit's row, its runs, the merges, the sums and
// the frontiers): durability is PostgreSQL's COMMIT, and after a crash of the process, of the
// connection or of the server, all of the epoch is there or none of it. Garbage collection
// happens in that transaction, in merges: when a step's newest runs together weigh as much as
// the run before them, they are merged into one (a k-way merge reading a few chunks of each
// run at a time), keeping of each key the snapshots after the horizon and the newest one at or
// before it (dropping it too if it is a tombstone and the merge reaches the step's oldest
// run). The horizon is the newest epoch committed at least BackupInterval ago, so no snapshot
// that Load can return, and no backup inside the window, is ever dropped; every run weighs
// more than all newer runs together, so a step has about log2(state / commit size) runs, and
// its rows hold at most about twice its live state plus the window's backups. Deleted chunk
// rows are reclaimed by PostgreSQL's autovacuum, as for any table.
//
// # Verification
//
// Load reads a step in one read-only REPEATABLE READ transaction (one committed state
// throughout), on a connection of its own (several Loads run at once), a few chunks of each
// run at a time, merging the runs in key order; fn is called in the caller's goroutine, and
// the store never holds more of a step than a few chunks per run. It checks the step's runs
// against step_sums, each run's chunk count, and as it reads them each chunk's checksum (which
// covers its run and position), entry count and order, and each run's entry count and
// checksum sum: a difference (a row changed, lost, added or moved behind the store's back) is
// an error wrapping recovery.ErrDamaged that names the store (its DSN without the password,
// and its schema) and the step. A Commit checks a step's counts and sums before adding a run,
// and a merge verifies every chunk it reads, so damage is never rewritten into a run whose
// checksums would bless it. Verify checks every step.
//
// # One writer
//
// A read-write store holds a session-level advisory lock, keyed by its schema, on a
// connection of its own from Open to Close, and runs Begin and Commit on that connection: a
// second read-write Open of the same schema (in this process or another) is refused with an
// error wrapping recovery.ErrInUse. The server releases the lock when that connection ends
// (Close, the process's death, a network failure, a server restart); the store then connects
// again at its next Begin or Commit and takes the lock again (ErrInUse if another writer took
// it meanwhile; a Commit also refuses when another execution has begun since). A read-only
// store (Options.ReadOnly) takes no lock and can inspect a store that a writer is using.
//
// # A cluster's processes
//
// All processes of a cluster use the same DSN and schema, so that any of them, restarted
// anywhere, finds the state. Only one of them commits: process 0, which opens the store for
// writing and calls Begin and Commit for the whole cluster's epochs. The others do not open
// it for writing (they would get ErrInUse); to read, they open it read-only.
//
// Errors are wrapped with %w and name the store and, where there is one, the step or epoch.
// The store starts no goroutine that outlives a call (pgx's cancel requests end before the
// call returns), and Close closes every connection.
package pgstore
