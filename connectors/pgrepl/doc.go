// Package pgrepl is a source of change events from a PostgreSQL logical replication slot that
// uses the pgoutput plugin (PostgreSQL 14 and later, whose pgoutput sends logical messages;
// tested with 15).
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
// transaction it emitted (or a later position the server reported, see below), plus, when an
// epoch ended inside a transaction, that transaction's commit LSN and how many of its events
// were emitted. Never the events themselves.
//
// A replication goroutine reads the stream, decodes it and queues the events for Next (at most
// Config.MaxBuffered; then it stops reading and the server waits). Commit(state) runs on the
// worker once the epoch of state is committed: it makes state.LSN the flushed LSN, and the
// replication goroutine sends it to the server at once (write = flush = apply = that LSN). The
// LSN the source ever reports is therefore a position before which every transaction of the
// slot has all its events in committed epochs; it never moves backwards, and it starts at the
// slot's confirmed_flush_lsn. Keepalives that ask for a reply are answered with that same
// LSN, never directly with the server's WAL end, and the goroutine sends a status update at
// least every Config.StatusInterval (10 s, or a third of wal_sender_timeout if that is
// shorter), also while an epoch takes long or the queue is full, so the server never drops
// the connection. Until a transaction's epoch is committed the server keeps the WAL it needs
// (the slot's restart_lsn and confirmed_flush_lsn do not pass it).
//
// The WAL end a keepalive reports is the position up to which the server has sent everything:
// every transaction that committed before it has been received. When one arrives between
// transactions, the goroutine queues it as a position marker behind the events already
// queued; Next moves the state to it (an epoch's state may so end at a position that is no
// transaction's end), and once that epoch is committed the source confirms it. So while the
// published tables are idle and other tables (or other databases of the server) fill the
// WAL, the slot still follows the WAL, within an epoch or two of what the server has sent,
// and its restart_lsn follows at the server's next record of running transactions (a
// checkpoint, or every 15 s of activity): the WAL the slot retains stays bounded by what the
// open epochs hold. A resumed run restarts at such a position as at a transaction's end: the
// server skips the transactions that committed before it, and so does the source.
//
// The server's end of the stream: a fast shutdown of the server makes each walsender wait
// until the client has confirmed everything it sent, then end the stream. The reported
// position is confirmed within about an epoch, so the shutdown finishes promptly, also with
// the flow connected and idle; a CopyDone from the server is answered with CopyDone, and the
// source reconnects once the server is back (see Delivery).
//
// # Delivery
//
// Exactly once into the flow's committed epochs: a fresh start streams from the slot's
// confirmed_flush_lsn; a resumed run restarts replication at the resume state's LSN, and the
// events the server sends again that the resume state covers (transactions that ended at or
// before it, and the first events of a transaction a committed epoch emitted in part) are
// skipped. The server only resends what the source did not confirm, and it confirms only
// committed epochs, so nothing is lost either. A sink that is exactly once
// (connectors/postgres) makes the whole flow exactly once.
//
// A lost replication connection (the server restarted, with a fast or an immediate
// shutdown, or the network broke) does not end the flow: the replication goroutine
// reconnects with back-off (100 ms doubling to 5 s) for up to Config.ReconnectTimeout (1
// minute; each attempt is logged) and restarts replication after what it has queued, the
// events already emitted in epochs that are still open included. The server sends again
// from the slot's confirmed_flush_lsn (after an immediate shutdown, from where its last
// checkpoint saved the slot), and the source skips what it had queued, as a resumed run
// skips what its state covers: nothing is emitted twice or lost. A connection lost during the
// initial copy fails the flow (the copy starts again when it is restarted).
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
// Build checks, before it creates anything, that the server has wal_level = logical, that
// the tables of Config.Tables exist (and may be read, for the initial copy), that the
// publication covers them (or, when it is to be created, that every table has a replica
// identity: a publication of a table without one makes the server refuse the table's UPDATEs
// and DELETEs), that the slot is a logical pgoutput slot of the same database, and that a
// resumed run's slot still exists. Then it creates the publication and the slot when
// CreatePublication and CreateSlot allow (the publication first: pgoutput cannot decode WAL
// written before its publication existed); a slot that cannot be created (a user without
// the REPLICATION attribute, max_replication_slots reached) fails the start, and the
// publication it created is dropped again. Errors name the table, publication or slot, and
// the Config field (or, with Config.FlagNames, the program's flag) to change.
//
// The slot's lifecycle: a slot keeps every WAL segment from its restart_lsn on, on the
// source server's disk, for as long as it exists, whether a flow reads it or not.
//   - A run that created the slot (and the publication) and ends before any epoch was
//     committed (its start failed, in the source or anywhere in the flow: a sink that cannot
//     prepare transactions, a missing column) drops them in Close: no recovery state refers
//     to them yet, and the next run creates them again.
//   - Once an epoch is committed, the recovery state refers to the slot's position and the
//     flow never drops the slot, unless Config.DropSlotAtEnd asks for it once the source has
//     ended. A resumed run whose slot is gone fails, saying so: the changes since are lost.
//   - A slot left behind by a flow that is gone (or will not run again) is dropped with the
//     server's tools: SELECT pg_drop_replication_slot('NAME') (it must not be active: stop the
//     flow first; SELECT slot_name, active, restart_lsn FROM pg_replication_slots lists them),
//     and its publication with DROP PUBLICATION NAME. Recovery state that refers to a dropped
//     slot cannot be resumed: start the flow afresh.
//
// Heartbeats are rarely needed: the keepalive positions above let the slot advance whenever
// the server writes WAL, whatever table or database it writes to, and a server that writes
// none retains none. Config.Heartbeat (pg-cdc: -heartbeat) also writes a small transactional
// logical message that often (pg_logical_emit_message with HeartbeatPrefix and no content), whose
// transaction the source confirms like any other, emitting no event for it: the slot's
// confirmed_flush_lsn (and the lag monitoring built on it) then moves at least that often
// through a transaction of the source's own. pgoutput sends logical messages whatever tables
// the publication covers, so no heartbeat table (or publication of one) is needed; the user
// needs EXECUTE on pg_logical_emit_message (granted by default).
//
// Lag: once a second the source reads the server's WAL write position (pg_current_wal_lsn, on
// its normal connection) and reports, as epochflow_source_lag (dataflow.Metrics) for its
// partition "slot/NAME", the bytes between it and the LSN it confirms (that of the last
// committed epoch): the WAL the slot makes the server keep for the flow. It rises while changes
// wait and falls to 0 once everything is read and committed and the server has reported its
// WAL end in a keepalive; WAL that other databases write makes it rise too, which is right: the
// slot keeps that WAL as well until the source confirms past it.
//
// # Running against a real server
//
// The server needs wal_level = logical, max_replication_slots and max_wal_senders of at least
// the number of flows (plus other clients), and a user with the REPLICATION attribute (or a
// superuser); the DSN is a normal connection string (the source adds replication=database for
// its replication connection). The tests start a throwaway
// PostgreSQL 15 cluster of their own (internal/pgtest): they need the server binaries
// (Debian: apt-get install postgresql-15) and, as root, the postgres system user.
package pgrepl
