// Package spool is the connector that docs/connector-guide.md builds step by step: a spool
// directory used as a queue, read and written exactly once.
//
// A producer drops messages into a directory as files, one message per file, named so that
// their names sort in the order they were produced (zero-padded sequence numbers or
// timestamps), written under a name that starts with a dot and then renamed, so that a reader
// never sees half a file. Read emits the files in name order and deletes them (its
// acknowledgement) only once the epoch that read them is committed. Write writes each item as
// a file into another directory, under a hidden name, and renames it to its final name only
// when its epoch is committed, so that a reader of that directory sees every item exactly once.
//
//	flow := dataflow.New("spool-copy")
//	msgs := dataflow.Input(flow, "read", spool.Read(spool.SourceConfig{Dir: "in", IdleExit: 5 * time.Second}))
//	dataflow.Output("write", msgs, spool.Write("out", func(m spool.Message) []byte { return m.Body }))
//
// Both are partitioned: one partition, the directory. The source's state is the name of the
// last file it emitted; the sink's is the number of epochs it has written.
package spool
