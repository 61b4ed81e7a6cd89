package file_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/epochflow/epochflow/connectors/file"
	"github.com/epochflow/epochflow/connectors/stdio"
	"github.com/epochflow/epochflow/dataflow"
)

// tempDir makes a directory for an example; the caller removes it.
func tempDir() string {
	dir, err := os.MkdirTemp("", "epochflow-file-example")
	if err != nil {
		panic(err)
	}
	return dir
}

func ExampleLines() {
	dir := tempDir()
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "input.txt")
	os.WriteFile(path, []byte("to be\r\nor not\nto be"), 0o644) // the last line has no "\n"

	flow := dataflow.New("upper")
	lines := dataflow.Input(flow, "read", file.Lines(path))
	upper := dataflow.Transform("upper", lines, func(b []string) ([]string, error) {
		out := make([]string, len(b))
		for i, l := range b {
			out[i] = strings.ToUpper(l)
		}
		return out, nil
	})
	dataflow.Output("print", upper, stdio.Print[string]())
	if err := dataflow.Run(context.Background(), flow, dataflow.Options{}); err != nil {
		fmt.Println(err)
	}
	// Output:
	// TO BE
	// OR NOT
	// TO BE
}

func ExampleDir() {
	dir := tempDir()
	defer os.RemoveAll(dir)
	os.WriteFile(filepath.Join(dir, "b.log"), []byte("b1\nb2\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "a.log"), []byte("a1\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("not read\n"), 0o644)

	flow := dataflow.New("logs")
	lines := dataflow.Input(flow, "read", file.Dir(dir, "*.log"))
	dataflow.Output("print", lines, stdio.Print[string]())
	// One worker reads the files in name order.
	if err := dataflow.Run(context.Background(), flow, dataflow.Options{Workers: 1}); err != nil {
		fmt.Println(err)
	}
	// Output:
	// a1
	// b1
	// b2
}

func ExampleLinesOut() {
	dir := tempDir()
	defer os.RemoveAll(dir)
	in, out := filepath.Join(dir, "words.txt"), filepath.Join(dir, "lengths.txt")
	os.WriteFile(in, []byte("go\nflow\n"), 0o644)

	flow := dataflow.New("lengths")
	words := dataflow.Input(flow, "read", file.Lines(in))
	kv := dataflow.Transform("len", words, func(b []string) ([]dataflow.KV[int], error) {
		out := make([]dataflow.KV[int], len(b))
		for i, w := range b {
			out[i] = dataflow.KV[int]{Key: w, Value: len(w)}
		}
		return out, nil
	})
	dataflow.Output("write", kv, file.LinesOut(out, func(kv dataflow.KV[int]) string {
		return fmt.Sprintf("%s\t%d", kv.Key, kv.Value)
	}))
	if err := dataflow.Run(context.Background(), flow, dataflow.Options{Workers: 2}); err != nil {
		fmt.Println(err)
	}
	b, _ := os.ReadFile(out)
	fmt.Print(string(b))
	// Output:
	// go	2
	// flow	4
}

func ExampleWriteLines() {
	dir := tempDir()
	defer os.RemoveAll(dir)
	in, out := filepath.Join(dir, "in.txt"), filepath.Join(dir, "out.txt")
	os.WriteFile(in, []byte("first\r\nsecond"), 0o644)

	flow := dataflow.New("copy")
	dataflow.Output("write", dataflow.Input(flow, "read", file.Lines(in)), file.WriteLines(out))
	if err := dataflow.Run(context.Background(), flow, dataflow.Options{}); err != nil {
		fmt.Println(err)
	}
	b, _ := os.ReadFile(out)
	fmt.Printf("%q\n", b)
	// Output:
	// "first\nsecond\n"
}
