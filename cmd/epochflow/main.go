// Command epochflow is epochflow's command-line tool.
//
// Usage:
//
//	epochflow recovery inspect PATH
//
// recovery inspect prints what the recovery store at PATH (a recovery directory, or the
// epochflow-0.sqlite3 file in it) holds: its executions, its committed epoch, and each
// step's keys and bytes. It opens the store read-only, so it may run while the flow runs.
//
// Exit codes: 0 on success, 1 on an error (printed on standard error), 2 on bad usage.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/epochflow/epochflow/recovery"
)

const usage = `usage: epochflow recovery inspect PATH

Commands:
  recovery inspect PATH   print the executions, committed epoch and per-step state of the
                          recovery store at PATH (a recovery directory, or its
                          ` + recovery.FileName + ` file); read-only
`

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help") {
		fmt.Fprint(stdout, usage)
		return 0
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

// inspect prints the store at path (a directory, or the store file in one).
func inspect(ctx context.Context, path string, w io.Writer) error {
	dir := path
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%s does not exist", path)
	case err != nil:
		return err
	case !fi.IsDir():
		if filepath.Base(path) != recovery.FileName {
			return fmt.Errorf("%s is a file, not a recovery directory or a %s file", path, recovery.FileName)
		}
		dir = filepath.Dir(path)
	}
	s, err := recovery.OpenSQLite(ctx, dir, recovery.SQLiteOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	defer s.Close()
	xs, err := s.Executions(ctx)
	if err != nil {
		return err
	}
	c, err := s.Committed(ctx)
	if err != nil {
		return err
	}
	steps, err := s.Steps(ctx)
	if err != nil {
		return err
	}

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "store\t%s\n", s.Path())
	fmt.Fprintf(tw, "schema version\t%d\n", recovery.SchemaVersion)
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
	}

	fmt.Fprintln(w)
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
