package stdio_test

import (
	"context"
	"fmt"
	"os"
	"strings"

	"github.com/epochflow/epochflow/connectors/stdio"
	"github.com/epochflow/epochflow/dataflow"
)

// upper is a step that upper-cases lines.
func upper(lines dataflow.Stream[string]) dataflow.Stream[string] {
	return dataflow.Transform("upper", lines, func(b []string) ([]string, error) {
		out := make([]string, len(b))
		for i, l := range b {
			out[i] = strings.ToUpper(l)
		}
		return out, nil
	})
}

// A filter that upper-cases standard input: `go run . < in.txt`. (No output is shown, since it
// depends on what standard input holds.)
func ExampleLines() {
	flow := dataflow.New("upper")
	lines := dataflow.Input(flow, "read", stdio.Lines())
	dataflow.Output("print", upper(lines), stdio.Print[string]())
	if err := dataflow.Run(context.Background(), flow, dataflow.Options{}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func ExampleLinesFrom() {
	in := strings.NewReader("hello\r\nworld") // the last line has no newline
	flow := dataflow.New("upper")
	lines := dataflow.Input(flow, "read", stdio.LinesFrom(in))
	dataflow.Output("print", upper(lines), stdio.Print[string]())
	if err := dataflow.Run(context.Background(), flow, dataflow.Options{}); err != nil {
		fmt.Println(err)
	}
	// Output:
	// HELLO
	// WORLD
}

func ExamplePrint() {
	flow := dataflow.New("count")
	lines := dataflow.Input(flow, "read", stdio.LinesFrom(strings.NewReader("a b\nc\n")))
	counts := dataflow.Transform("count", lines, func(b []string) ([]dataflow.KV[int], error) {
		out := make([]dataflow.KV[int], len(b))
		for i, l := range b {
			out[i] = dataflow.KV[int]{Key: l, Value: len(strings.Fields(l))}
		}
		return out, nil
	})
	// fmt.Sprint of a dataflow.KV.
	dataflow.Output("print", counts, stdio.Print[dataflow.KV[int]]())
	if err := dataflow.Run(context.Background(), flow, dataflow.Options{}); err != nil {
		fmt.Println(err)
	}
	// Output:
	// {a b 2}
	// {c 1}
}

func ExamplePrintTo() {
	var out strings.Builder
	flow := dataflow.New("quote")
	lines := dataflow.Input(flow, "read", stdio.LinesFrom(strings.NewReader("one\ntwo\n")))
	dataflow.Output("print", lines, stdio.PrintTo(&out, func(s string) string { return fmt.Sprintf("%q", s) }))
	if err := dataflow.Run(context.Background(), flow, dataflow.Options{}); err != nil {
		fmt.Println(err)
	}
	fmt.Print(out.String())
	// Output:
	// "one"
	// "two"
}
