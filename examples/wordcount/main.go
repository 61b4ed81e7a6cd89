// Command wordcount counts the words of a text with an epochflow flow: it splits lines on white
// space, keys every word by itself (so each word's count lives on one worker), counts per key
// and writes one "word<TAB>count" line per distinct word, in no particular order.
//
//	go run ./examples/wordcount -input FILE -output FILE [-workers N] [-epoch-interval D]
//
// Without -input it reads standard input; without -output it writes standard output. A run
// without recovery state for the -output file refuses a file that holds data, unless
// -output-exists says to replace it or append to it.
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/connectors/stdio"
	"github.com/epochflow/epochflow/dataflow"
	"github.com/epochflow/epochflow/operators"
)

func main() {
	input := flag.String("input", "", "text file to count (default: standard input)")
	output := flag.String("output", "", "file to write the counts to (default: standard output)")
	var exists file.IfExists
	flag.Var(&exists, "output-exists", "what a run without recovery state for the -output file does when that file holds data: refuse (the default), replace it, or append to it")
	dataflow.Usage("wordcount counts the words of a text and writes one \"word<TAB>count\" line per distinct word.",
		"wordcount -input examples/wordcount/sample.txt -output counts.txt")
	dataflow.MainFunc(func() (*dataflow.Flow, error) {
		return build(*input, *output, exists), nil
	})
}

func format(kv dataflow.KV[int]) string { return fmt.Sprintf("%s\t%d", kv.Key, kv.Value) }

// build returns the word count flow reading input (stdin when empty) and writing output (stdout
// when empty).
func build(input, output string, exists file.IfExists) *dataflow.Flow {
	flow := dataflow.New("wordcount")
	var src dataflow.Source[string]
	if input == "" {
		src = stdio.Lines()
	} else {
		src = file.Lines(input)
	}
	lines := operators.Input(flow, "read", src)
	// One file is one partition, read by one worker: spread its lines over all workers (each
	// batch to the worker with the least backlog) so that every worker splits and counts.
	spread := operators.Redistribute("spread", lines)
	words := operators.FlatMapSeq("split", spread, strings.FieldsSeq)
	counts := operators.Count("count", words, func(w string) string { return w })
	var sink dataflow.Sink[dataflow.KV[int]]
	if output == "" {
		sink = stdio.PrintTo(os.Stdout, format)
	} else {
		sink = file.LinesOut(output, format, file.OnExisting(exists), file.ExistsFlag("-output-exists"))
	}
	operators.Output("write", counts, sink)
	return flow
}
