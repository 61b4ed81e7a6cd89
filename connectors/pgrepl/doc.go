// Package pgrepl is a source of change events from a PostgreSQL logical replication slot that
// uses the pgoutput plugin (PostgreSQL 10 and later; tested with 15).
//
//	src := pgrepl.Changes(pgrepl.Config{
//		DSN: "postgres://user:pass@host:5432/db", Slot: "flow", Publication: "flow",
//		Tables: []string{"public.orders"}, CreateSlot: true, CreatePublication: true,
//	})
//	changes := operators.Input(flow, "cdc", src)
//
// # Events
//
// Every transaction comes as a Begin event, its changes (Insert, Update, Delete, Truncate, and
// transactional logical messages as Message), and a Commit event whose LSN is the
// transaction's end LSN. Row changes carry their Relation (schema, table, columns with type
// and key flag, replica identity); a table altered while the flow runs gets a new Relation
// from the change after the ALTER on. Values are decoded from pgoutput's text format:
//
//	bool → bool; int2, int4, int8 → int16, int32, int64; float4, float8 → float32, float64;
//	numeric → pgtype.Numeric; text, varchar, bpchar, name → string; bytea → []byte;
//	uuid → [16]byte; date, timestamp, timestamptz → time.Time (pgtype.InfinityModifier for
//	±infinity); json, jsonb → json.RawMessage; arrays of these → []any (nested []any for
//	more dimensions, nil for NULL elements); any other type → string, its text form
//	(pgx's pgtype.Map can decode it: Decode(oid, text) shows how the above are done).
//
// NULL is nil. An unchanged TOASTed value (a large value an UPDATE did not touch, which
// pgoutput does not send) is UnchangedToast{}, never nil. The old values of an Update or
// Delete are there when the replica identity sends them: the key columns (OldKey) under
// DEFAULT or USING INDEX (for an Update only when the key changed), the whole old row (OldRow)
// under FULL.
//
// # Partitions, state, epochs and Commit
//
// A slot is one stream with one position, so the source has one partition, "slot/NAME": it
// lives on one worker, and a flow that needs parallelism spreads the events after the source
// (operators.KeyOn). Its state (State, a few bytes) is the end LSN of the last complete
// transaction it emitted, plus, when an epoch ended inside a transaction, that transaction's
// commit LSN and how many of its events were emitted. Never the events themselves.
//
// A replication goroutine reads the stream, decodes it and queues the events for Next (at most
// Config.MaxBuffered; then it stops reading and the server waits). Commit(state) runs on the
// worker once the epoch of state is committed: it makes state.LSN the flushed LSN, and the
// replication goroutine sends it to the server at once (write = flush = apply = that LSN). The
// LSN the source ever reports is therefore the end LSN of a transaction whose every event is
// part of a committed epoch; it never moves backwards, and it starts at the slot's
// confirmed_flush_lsn. Keepalives that ask for a reply are answered with that same LSN, never
// with the server's WAL end, and the goroutine sends a status update at least every
// Config.StatusInterval (10 s, or a third of wal_sender_timeout if that is shorter), also
// while an epoch takes long or the queue is full, so the server never drops the connection.
// Until a transaction's epoch is committed the server keeps the WAL it needs (the slot's
// restart_lsn and confirmed_flush_lsn do not pass it).
//
// # Delivery
//
// Exactly once into the flow's committed epochs: a fresh start streams from the slot's
// confirmed_flush_lsn; a resumed run restarts replication at the resume state's LSN, and the
// events the server sends again that the resume state covers (transactions that ended at or
// before it, and the first events of a transaction a committed epoch emitted in part) are
// skipped. The server only resends what the source did not confirm, and it confirms only
// committed epochs, so nothing is lost either. A sink that is exactly once (connectors/postgres)
// makes the whole flow exactly once.
//
// # Initial copy
//
// A slot streams only what is committed after it was created. Config.InitialCopy makes a run
// without recovery state first emit a Truncate of Config.Tables and then every row of them as
// an Insert, all with FromCopy set, read in one REPEATABLE READ snapshot taken after the slot
// exists, and then stream from the slot (replication starts once the copy is done). The
// Truncate makes a consumer's copy exactly the tables' rows, whatever an earlier, unfinished
// copy left. The changes committed between the slot's
// position and the snapshot reach the flow twice, in the copy and from the stream: applied by
// key, inserts as upserts, they change nothing, so the target converges to the table. While
// the copy runs, State.Copying is set; a run resumed from such a state copies again, with a
// new snapshot, starting with the Truncate again. While a copy runs, a consumer's table holds
// only part of the rows. Applying the replayed changes "by key, as upserts" includes updates
// that move a row to another key: a replayed insert may bring back the old row while the copy
// already holds the new one, so the moved row must replace what is at the new key (the
// postgres sink does; a plain UPDATE would fail with a duplicate key).
//
// # Slots, publications and heartbeats
//
// Build checks that the tables of Config.Tables exist and that the publication covers them,
// and that the slot is a logical pgoutput slot of the same database; it creates the
// publication and the slot when CreatePublication and CreateSlot allow (the publication
// first: pgoutput cannot decode WAL written before its publication existed). Errors name the
// table, publication or slot. The flow never drops a slot unless Config.DropSlotAtEnd asks
// for it. An idle database (or one whose writes are all to unpublished tables) gives the
// source no transaction to confirm, so the slot would hold WAL forever: Config.Heartbeat
// writes a small transactional logical message that often, whose transaction the source
// confirms like any other (it emits no event for it).
//
// # Running against a real server
//
// The server needs wal_level = logical, max_replication_slots and max_wal_senders of at least
// the number of flows (plus other clients), and a user with the REPLICATION attribute (or a
// superuser); the DSN is a normal connection string (the source adds replication=database for
// its replication connection). A slot left behind by a flow that is gone keeps WAL on the
// server: drop it with SELECT pg_drop_replication_slot('NAME'). The tests start a throwaway
// PostgreSQL 15 cluster of their own (internal/pgtest): they need the server binaries
// (Debian: apt-get install postgresql-15) and, as root, the postgres system user.
package pgrepl
