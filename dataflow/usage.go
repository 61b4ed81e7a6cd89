package dataflow

import (
	"flag"
	"fmt"
	"path/filepath"
	"sync/atomic"
)

// graphOnly is set by MainFunc, before it calls the build function, when the program was
// started with -graph.
var graphOnly atomic.Bool

// GraphOnly tells a MainFunc build function whether the program was started with -graph, to
// describe its flow without running it. The build function must then connect nowhere (check
// no database, create no table) and may skip the checks of flags that only a run needs (a
// required -queue), so that -graph works with no flag and no server: the connectors connect
// only when the flow runs, so building the flow itself is safe. Outside a build function
// called by MainFunc it returns false.
func GraphOnly() bool { return graphOnly.Load() }

// Usage makes the program's -help (the Usage of flag.CommandLine) start with what, one
// sentence of what the program does, and example, a command line that runs it, before the
// flags and their defaults:
//
//	dataflow.Usage("wordcount counts the words of a text file.", "wordcount -input sample.txt -output counts.txt")
//
// Call it in main, before MainFunc.
func Usage(what, example string) {
	fs := flag.CommandLine
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintf(w, "%s\n\nExample:\n  %s\n\nUsage of %s:\n", what, example, filepath.Base(fs.Name()))
		fs.PrintDefaults()
	}
}
