package dataflow

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/epochflow/epochflow/dataflow/internal/cluster"
)

// clusterFlags are Main's flags for running a flow on several processes.
type clusterFlags struct {
	addresses   *string
	process     processID
	secret      *string
	peerTimeout *time.Duration
	tls         [3]*string // -tls-cert, -tls-key, -tls-ca
}

var tlsFlagNames = [3]string{"tls-cert", "tls-key", "tls-ca"}

func init() {
	envFlags = append(envFlags,
		struct{ flag, env, want string }{"addresses", "EPOCHFLOW_ADDRESSES", ""},
		struct{ flag, env, want string }{"process-id", "EPOCHFLOW_PROCESS_ID", "a whole number, or a name ending in -N such as flow-3"},
		struct{ flag, env, want string }{"cluster-secret", "EPOCHFLOW_CLUSTER_SECRET", ""},
		struct{ flag, env, want string }{"peer-timeout", "EPOCHFLOW_PEER_TIMEOUT", "a duration such as 10s"},
		struct{ flag, env, want string }{"tls-cert", "EPOCHFLOW_TLS_CERT", ""},
		struct{ flag, env, want string }{"tls-key", "EPOCHFLOW_TLS_KEY", ""},
		struct{ flag, env, want string }{"tls-ca", "EPOCHFLOW_TLS_CA", ""},
	)
}

func addClusterFlags(fs *flag.FlagSet) *clusterFlags {
	c := &clusterFlags{}
	c.addresses = fs.String("addresses", "", "run on several processes: host:port of every process, comma-separated, "+
		"in process order, the same list for all (env EPOCHFLOW_ADDRESSES); empty runs this process alone")
	fs.Var(&c.process, "process-id", "this process's number in -addresses, from 0; a StatefulSet pod name such "+
		"as flow-3 gives 3 (env EPOCHFLOW_PROCESS_ID)")
	c.secret = fs.String("cluster-secret", "", "a secret shared by the processes of -addresses, required with more "+
		"than one address: a connection that does not prove it is refused (env EPOCHFLOW_CLUSTER_SECRET; "+
		"prefer the variable, a flag shows in the process list)")
	c.peerTimeout = fs.Duration("peer-timeout", DefaultPeerTimeout, "with -addresses, how long a peer may be silent or "+
		"gone before every process stops with an error naming it (env EPOCHFLOW_PEER_TIMEOUT)")
	c.tls[0] = fs.String("tls-cert", "", "with -addresses, run the exchange over mutual TLS 1.3: this process's certificate "+
		"(PEM, valid for its host in -addresses), with -tls-key and -tls-ca; -cluster-secret is then optional "+
		"(env EPOCHFLOW_TLS_CERT)")
	c.tls[1] = fs.String("tls-key", "", "the private key (PEM) of -tls-cert (env EPOCHFLOW_TLS_KEY)")
	c.tls[2] = fs.String("tls-ca", "", "the CA certificate(s) (PEM) that signed every process's -tls-cert "+
		"(env EPOCHFLOW_TLS_CA)")
	return c
}

// options checks the flags and returns the run's ClusterOptions (nil without -addresses), or
// false after writing what is wrong.
func (c *clusterFlags) options(stderr io.Writer, recoveryDir string) (*ClusterOptions, bool) {
	if *c.peerTimeout <= 0 {
		fmt.Fprintf(stderr, "invalid value %v for flag -peer-timeout: want a positive duration such as 10s\n", *c.peerTimeout)
		return nil, false
	}
	var tlsOpts *ClusterTLS
	if given := *c.tls[0] != "" || *c.tls[1] != "" || *c.tls[2] != ""; given {
		for i, name := range tlsFlagNames {
			if *c.tls[i] == "" {
				fmt.Fprintf(stderr, "-%s is missing: mutual TLS needs -tls-cert, -tls-key and -tls-ca (or "+
					"EPOCHFLOW_TLS_CERT, EPOCHFLOW_TLS_KEY and EPOCHFLOW_TLS_CA), all three or none\n", name)
				return nil, false
			}
		}
		if *c.addresses == "" {
			fmt.Fprintf(stderr, "-tls-cert needs -addresses: TLS secures the exchange between the processes of a cluster\n")
			return nil, false
		}
		if _, err := cluster.LoadTLS(*c.tls[0], *c.tls[1], *c.tls[2]); err != nil {
			fmt.Fprintf(stderr, "invalid -tls-cert, -tls-key or -tls-ca: %v\n", err)
			return nil, false
		}
		tlsOpts = &ClusterTLS{CertFile: *c.tls[0], KeyFile: *c.tls[1], CAFile: *c.tls[2]}
	}
	if *c.addresses == "" {
		if c.process.set && c.process.n != 0 {
			fmt.Fprintf(stderr, "-process-id %d needs -addresses: the list of every process's host:port\n", c.process.n)
			return nil, false
		}
		return nil, true
	}
	var addrs []string
	for a := range strings.SplitSeq(*c.addresses, ",") {
		a = strings.TrimSpace(a)
		if _, port, ok := strings.Cut(a, ":"); !ok || a == "" || port == "" {
			fmt.Fprintf(stderr, "invalid value %q for flag -addresses: want host:port of every process, comma-separated\n", *c.addresses)
			return nil, false
		}
		addrs = append(addrs, a)
	}
	if c.process.n >= len(addrs) {
		fmt.Fprintf(stderr, "invalid value %d for flag -process-id: -addresses lists %d processes (0 to %d)\n",
			c.process.n, len(addrs), len(addrs)-1)
		return nil, false
	}
	if len(addrs) > 1 && *c.secret == "" && tlsOpts == nil {
		fmt.Fprintf(stderr, "-addresses lists %d processes: give -cluster-secret (or EPOCHFLOW_CLUSTER_SECRET), the same "+
			"for all of them, or -tls-cert, -tls-key and -tls-ca, so that no stranger can join\n", len(addrs))
		return nil, false
	}
	return &ClusterOptions{Addresses: addrs, Process: c.process.n, Secret: *c.secret, PeerTimeout: *c.peerTimeout,
		TLS: tlsOpts}, true
}

// processID is -process-id: a number, or a name that ends in -N (a StatefulSet's pod name).
type processID struct {
	n   int
	set bool
}

func (p *processID) String() string { return strconv.Itoa(p.n) }

func (p *processID) Set(s string) error {
	s = strings.TrimSpace(s)
	if i := strings.LastIndex(s, "-"); i >= 0 && i < len(s)-1 {
		s = s[i+1:]
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return fmt.Errorf("want a whole number from 0, or a name ending in -N such as flow-3")
	}
	p.n, p.set = n, true
	return nil
}
