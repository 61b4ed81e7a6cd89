// Command epochflow is epochflow's command-line tool.
//
// Usage:
//
//	epochflow recovery inspect PATH
//	epochflow graph SOURCE
//
// recovery inspect prints what the recovery store at PATH (a recovery directory, or the
// epochflow-0.sqlite3 file in it, or the postgres:// URL of a PostgreSQL store, as -recovery
// takes them) holds: its executions (with each worker's frontier at its
// last commit), its committed epoch, each step's keys and bytes, and where each source and
// sink partition of the project's connectors resumes, in words (a file offset or output
// length, an LSN, a Kafka offset, a queue consumer's snapshot); and it verifies the store as a
// resume would (SQLite's quick check of the file, and every step's snapshot rows against the
// counts and checksums its commits recorded): "verification ok", or "verification damaged:
// why". It opens the store read-only, so it may run while the flow runs.
//
// graph prints a flow's graph as a Mermaid flowchart, from the JSON a running flow serves at
// /dataflow (-metrics-addr): SOURCE is that URL (http://HOST:PORT/dataflow), a file holding the
// JSON, or - for standard input. (A program built on dataflow.Main prints its own with -graph.)
//
// Each command takes -h or -help. Exit codes: 0 on success, 1 on an error or a damaged store
// (printed on standard error), 2 on bad usage.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/epochflow/epochflow/recovery"
)

const usage = `usage: epochflow recovery inspect PATH
       epochflow graph SOURCE

Commands:
  recovery inspect PATH   print the executions, committed epoch, per-step state and the
                          source and sink partitions' resume positions of the recovery
                          store at PATH (a recovery directory, or its
                          ` + recovery.FileName + ` file), and verify it as a
                          resume would (exit 1 if it is damaged); read-only
  graph SOURCE            print a flow's graph as a Mermaid flowchart, from the JSON a
                          running flow serves at /dataflow: SOURCE is that URL
                          (http://HOST:PORT/dataflow), a file, or - for standard input

Each command takes -h or -help.
`

const inspectUsage = `usage: epochflow recovery inspect PATH

Prints what the recovery store at PATH (a recovery directory, or its ` + recovery.FileName + `
file, or a postgres:// URL of a PostgreSQL store, schema from ?schema=) holds, and verifies it as a resume would; it opens the store read-only, so it may run
while the flow runs. Exit 1 if the store is damaged.

  - the store, its schema, the verification, the flow and the committed epoch;
  - the executions: when each started, with how many workers, its steps, and FRONTIERS:
    where each worker stood at the last commit it took part in (the last epoch all its steps
    had closed, one before its frontier; "end" once it had read all its input); the epoch
    committed then is the smallest of them;
  - each step's keys, bytes and snapshot rows;
  - POSITION: where each source and sink partition resumes, in words (a file offset or
    output length, an LSN, a Kafka offset, a queue consumer's snapshot), for the
    connectors this tool knows.

Example:
  epochflow recovery inspect ./state
`

const graphUsage = `usage: epochflow graph SOURCE

Prints a flow's graph as a Mermaid flowchart (paste it into a Markdown file or
mermaid.live), from the JSON a running flow serves at /dataflow with -metrics-addr. SOURCE
is that URL, a file holding the JSON, or - for standard input.

Example:
  epochflow graph http://127.0.0.1:9090/dataflow
`

// isHelp tells whether arg asks for help.
func isHelp(arg string) bool {
	return arg == "-h" || arg == "-help" || arg == "--help" || arg == "help"
}

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	switch {
	case len(args) == 1 && isHelp(args[0]):
		fmt.Fprint(stdout, usage)
		return 0
	case len(args) >= 2 && args[0] == "recovery" && isHelp(args[1]),
		len(args) >= 3 && args[0] == "recovery" && args[1] == "inspect" && isHelp(args[2]):
		fmt.Fprint(stdout, inspectUsage)
		return 0
	case len(args) >= 1 && args[0] == "graph":
		return graphCommand(ctx, args[1:], stdout, stderr)
	}
	if len(args) != 3 || args[0] != "recovery" || args[1] != "inspect" || args[2] == "" {
		if len(args) > 0 && args[0] == "recovery" && (len(args) < 2 || args[1] != "inspect") {
			fmt.Fprintf(stderr, "epochflow recovery: want the subcommand inspect\n")
		} else if len(args) > 0 && args[0] != "recovery" {
			fmt.Fprintf(stderr, "epochflow: unknown command %q\n", args[0])
		}
		fmt.Fprint(stderr, usage)
		return 2
	}
	if err := inspect(ctx, args[2], stdout); err != nil {
		fmt.Fprintf(stderr, "epochflow recovery inspect: %v\n", err)
		return 1
	}
	return 0
}

// inspect prints the store at path (a directory, or the store file in one, or a PostgreSQL
// URL).
func inspect(ctx context.Context, path string, w io.Writer) error {
	s, name, version, err := openInspected(ctx, path)
	if err != nil {
		return err
	}
	defer s.Close()
	verr := s.Verify(ctx)
	if verr != nil && !errors.Is(verr, recovery.ErrDamaged) {
		return verr
	}
	// What a damaged store lets read is printed too, and the damage is the error.
	xs, err := s.Executions(ctx)
	if err != nil && verr == nil {
		return err
	}
	c, err := s.Committed(ctx)
	if err != nil && verr == nil {
		return err
	}
	steps, stepsErr := s.Steps(ctx)
	if stepsErr != nil && verr == nil {
		return stepsErr
	}
	var pos []position
	if stepsErr == nil {
		var perr error
		pos, perr = positions(ctx, s, steps)
		if perr != nil && verr == nil {
			return perr
		}
	}
	if err := report(w, name, version, xs, c, steps, stepsErr, verr); err != nil {
		return err
	}
	if err := reportPositions(w, pos); err != nil {
		return err
	}
	if verr != nil {
		return fmt.Errorf("%s is damaged: do not resume from it (see the verification line)", name)
	}
	return nil
}

// report writes what inspect prints: stepsErr is Steps' error, verr Verify's.
func report(w io.Writer, path string, version int, xs []recovery.ExecutionInfo, c recovery.CommitInfo, steps []recovery.StepInfo, stepsErr, verr error) error {

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "store\t%s\n", path)
	fmt.Fprintf(tw, "schema version\t%d\n", version)
	if verr == nil {
		fmt.Fprintf(tw, "verification\tok\n")
	} else {
		fmt.Fprintf(tw, "verification\tdamaged: %v\n", verr)
	}
	if len(xs) > 0 {
		fmt.Fprintf(tw, "flow\t%s\n", name(xs[len(xs)-1].Flow))
	}
	if c.Epoch == 0 {
		fmt.Fprintf(tw, "committed epoch\tnone\n")
	} else {
		fmt.Fprintf(tw, "committed epoch\t%d at %s by execution %d\n", c.Epoch, stamp(c.At), c.Execution)
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintln(w)
	if len(xs) == 0 {
		fmt.Fprintln(w, "no executions")
	} else {
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "EXECUTION\tSTARTED\tWORKERS\tFLOW\tFRONTIERS\tSTEPS")
		for _, x := range xs {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%s\t%s\t%s\n", x.Execution, stamp(x.Started), x.Workers, name(x.Flow), frontiers(x.Frontiers), list(x.Steps))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		fmt.Fprintln(w, wrap(frontiersHelp, 96))
	}

	fmt.Fprintln(w)
	if stepsErr != nil {
		fmt.Fprintf(w, "state unreadable: %v\n", stepsErr)
		return nil
	}
	if len(steps) == 0 {
		fmt.Fprintln(w, "no state")
		return nil
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tKEYS\tBYTES\tROWS")
	for _, st := range steps {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\n", name(st.Step), st.Keys, st.Bytes, st.Rows)
	}
	return tw.Flush()
}

// reportPositions writes the partitions' resume positions, if inspect recognised any.
func reportPositions(w io.Writer, pos []position) error {
	if len(pos) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STEP\tPARTITION\tEPOCH\tPOSITION")
	for _, p := range pos {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\n", name(p.step), name(p.key), p.epoch, p.words)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintln(w, wrap(positionsHelp, 96))
	return err
}

// wrap breaks text into lines of at most width characters, at spaces.
func wrap(text string, width int) string {
	var b strings.Builder
	n := 0
	for i, word := range strings.Fields(text) {
		if i > 0 && n+1+len(word) > width {
			b.WriteByte('\n')
			n = 0
		} else if i > 0 {
			b.WriteByte(' ')
			n++
		}
		b.WriteString(word)
		n += len(word)
	}
	return b.String()
}

// stamp formats a time for the table: UTC, to the millisecond.
func stamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// frontiers formats the workers' frontiers, "-" if none were committed.
func frontiers(fs []uint64) string {
	if fs == nil {
		return "-"
	}
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = strconv.FormatUint(f, 10)
		if f == math.MaxUint64 {
			parts[i] = "end" // the worker had read all its input
		}
	}
	return strings.Join(parts, ",")
}

// list formats step ids, "-" if none.
func list(steps []string) string {
	if len(steps) == 0 {
		return "-"
	}
	parts := make([]string, len(steps))
	for i, s := range steps {
		parts[i] = name(s)
	}
	return strings.Join(parts, ",")
}

// name is a step id or flow name as printed: as it is, or quoted if it is empty or holds
// anything but letters, digits and punctuation other than commas and quotes.
func name(s string) string {
	if s == "" {
		return `""`
	}
	for _, r := range s {
		if !unicode.IsPrint(r) || unicode.IsSpace(r) || r == ',' || r == '"' {
			return strconv.Quote(s)
		}
	}
	return s
}
