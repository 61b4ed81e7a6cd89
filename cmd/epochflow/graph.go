package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/epochflow/epochflow/dataflow"
)

// graphCommand runs "epochflow graph SOURCE": it reads a flow's Description (the JSON of
// /dataflow) from SOURCE and prints it as a Mermaid flowchart.
func graphCommand(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 && isHelp(args[0]) {
		fmt.Fprint(stdout, graphUsage)
		return 0
	}
	if len(args) != 1 || args[0] == "" {
		fmt.Fprint(stderr, graphUsage)
		return 2
	}
	d, err := readDescription(ctx, args[0])
	if err != nil {
		fmt.Fprintf(stderr, "epochflow graph: %v\n", err)
		return 1
	}
	fmt.Fprint(stdout, d.Mermaid())
	return 0
}

// readDescription reads the JSON of a flow's graph from an http(s) URL, a file or - (standard
// input).
func readDescription(ctx context.Context, src string) (dataflow.Description, error) {
	var d dataflow.Description
	var r io.Reader
	switch {
	case src == "-":
		r = os.Stdin
	case strings.HasPrefix(src, "http://") || strings.HasPrefix(src, "https://"):
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, src, nil)
		if err != nil {
			return d, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return d, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return d, fmt.Errorf("%s: %s", src, resp.Status)
		}
		r = resp.Body
	default:
		f, err := os.Open(src)
		if err != nil {
			return d, err
		}
		defer f.Close()
		r = f
	}
	if err := json.NewDecoder(r).Decode(&d); err != nil {
		return d, fmt.Errorf("%s: not the JSON of a flow's graph (/dataflow): %w", src, err)
	}
	if d.Flow == "" && len(d.Steps) == 0 {
		return d, fmt.Errorf("%s: not the JSON of a flow's graph (/dataflow): no flow and no steps", src)
	}
	return d, nil
}
