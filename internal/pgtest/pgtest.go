// Package pgtest starts a throwaway PostgreSQL 15 cluster for the tests of the Postgres
// connectors: its own data directory in a temporary directory, its own port, wal_level=logical
// (so logical replication slots work), max_prepared_transactions=20 (so two-phase commit works)
// and fsync=off (it is thrown away). One cluster per test binary, started from TestMain, is the
// intended use:
//
//	var pg *pgtest.Cluster
//
//	func TestMain(m *testing.M) {
//		pg = pgtest.MustStart()
//		code := m.Run()
//		pg.Stop()
//		os.Exit(code)
//	}
//
// It needs the PostgreSQL server binaries (Debian: apt-get install postgresql-15; found in
// /usr/lib/postgresql/*/bin, or where EPOCHFLOW_PG_BIN points). initdb refuses to run as root,
// so when the tests run as root the cluster runs as the "postgres" system user. Without the
// binaries Start fails with an error that says so: tests that need the cluster fail, never skip.
//
// The server runs as a child process of the test binary with a parent-death signal, so a test
// binary that is killed does not leave it running. Halt and Restart stop it with the
// cluster's own pg_ctl (pg_ctl stop -m fast, -m immediate), as an operator would; the start
// that follows is pgtest's, since pg_ctl start would detach the server from the test binary.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"
)

// Cluster is a running throwaway PostgreSQL cluster.
type Cluster struct {
	// Port is the TCP port the server listens on, on 127.0.0.1.
	Port int
	// Dir is the temporary directory that holds the data directory, the socket and the log.
	Dir string

	bin, data string // for Boot
	cred      *syscall.Credential
	cmd       *exec.Cmd
	exited    chan struct{}
	stopped   atomic.Bool
	dbs       atomic.Int64
}

// DSN returns the connection string of database db (the "postgres" superuser, no password).
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, db)
}

// LogFile is the path of the server's log.
func (c *Cluster) LogFile() string { return filepath.Join(c.Dir, "pg", "server.log") }

// binDir finds the directory of initdb and postgres.
func binDir() (string, error) {
	if d := os.Getenv("EPOCHFLOW_PG_BIN"); d != "" {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err != nil {
			return "", fmt.Errorf("pgtest: EPOCHFLOW_PG_BIN=%s: %w", d, err)
		}
		return d, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { // newest major version first
		vi, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[i])))
		vj, _ := strconv.Atoi(filepath.Base(filepath.Dir(dirs[j])))
		return vi > vj
	})
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("pgtest: PostgreSQL server binaries not found (no /usr/lib/postgresql/*/bin/initdb, no initdb in PATH); " +
		"install them (Debian: apt-get install -y postgresql-15) or set EPOCHFLOW_PG_BIN to their directory")
}

// freePort asks the kernel for a free TCP port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Main runs a test binary's tests with a throwaway cluster: it starts one, sets *c to it, runs
// m, stops it, runs the cleanups, then checks that no goroutine is left over
// (go.uber.org/goleak), and exits. Use it as TestMain's body. A failure to start the cluster fails the binary (it never skips).
func Main(m *testing.M, c **Cluster, cleanups ...func()) {
	cl, err := Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*c = cl
	code := m.Run()
	cl.Stop()
	for _, f := range cleanups {
		f()
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines left over after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Start creates and starts a cluster. It takes about two seconds. Stop it with Stop.
func Start() (*Cluster, error) { return StartWith("") }

// StartWith is Start with extra postgresql.conf lines (which win over the defaults), such as
// "max_prepared_transactions=0".
func StartWith(conf string) (*Cluster, error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "epochflow-pgtest-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	c := &Cluster{Dir: dir}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(dir)
		}
	}()
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	pgdir := filepath.Join(dir, "pg")
	if err := os.Mkdir(pgdir, 0o700); err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	cred, err := credential()
	if err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(pgdir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
	}
	data := filepath.Join(pgdir, "data")
	initdb := exec.Command(filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = pgdir
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("pgtest: initdb: %v\n%s", err, out)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
		conf := fmt.Sprintf(`
listen_addresses='127.0.0.1'
port=%d
unix_socket_directories='%s'
wal_level=logical
max_replication_slots=20
max_wal_senders=20
max_prepared_transactions=20
max_connections=100
fsync=off
full_page_writes=off
wal_sender_timeout=60s
log_min_messages=warning
%s
`, port, pgdir, conf)
		if err := os.WriteFile(filepath.Join(data, "postgresql.auto.conf"), []byte(conf), 0o600); err != nil {
			return nil, fmt.Errorf("pgtest: %w", err)
		}
		if cred != nil {
			os.Chown(filepath.Join(data, "postgresql.auto.conf"), int(cred.Uid), int(cred.Gid))
		}
		c.Port, c.bin, c.data, c.cred = port, bin, data, cred
		if err := c.startServer(bin, data, cred); err != nil {
			lastErr = err
			continue
		}
		ok = true
		return c, nil
	}
	return nil, lastErr
}

// credential returns the user the server must run as: nil when the tests do not run as root,
// the "postgres" system user when they do.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgtest: running as root, and initdb refuses root: need a \"postgres\" system user (%w)", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

func (c *Cluster) startServer(bin, data string, cred *syscall.Credential) error {
	logf, err := os.OpenFile(c.LogFile(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = filepath.Dir(data)
	// SIGQUIT is PostgreSQL's immediate shutdown: the server goes when the test binary goes.
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgtest: starting postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		conn, err := pgx.Connect(ctx, c.DSN("postgres"))
		cancel()
		if err == nil {
			conn.Close(context.Background())
			c.cmd, c.exited = cmd, exited
			return nil
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(c.LogFile())
			return fmt.Errorf("pgtest: postgres exited at start on port %d: %s", c.Port, tail(string(log), 2000))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			<-exited
			return fmt.Errorf("pgtest: postgres did not accept connections within 30s: %v", err)
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// Stop shuts the server down (fast shutdown, then SIGKILL of its processes after 10 s) and
// removes its directory. It may be called more than once.
func (c *Cluster) Stop() error {
	if c == nil || !c.stopped.CompareAndSwap(false, true) {
		return nil
	}
	if c.cmd != nil {
		c.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-c.exited:
		case <-time.After(10 * time.Second):
			c.kill()
		}
	}
	return os.RemoveAll(c.Dir)
}

// kill sends SIGKILL to the server's processes (its process group: the postmaster's children
// too, which would otherwise keep its shared memory and keep a new postmaster from starting)
// and waits for the postmaster to exit.
func (c *Cluster) kill() {
	syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	<-c.exited
}

// restartTimeout is how long Restart waits for the server to shut down.
var restartTimeout = 60 * time.Second

// Restart is pg_ctl restart -m MODE: it stops the server with pg_ctl stop -m MODE (Halt) and
// starts it again (Boot), on the same port and data directory. Mode "fast": open
// transactions are rolled back, clients disconnected, a checkpoint written; "immediate": the
// server's processes quit at once, and it starts with crash recovery. Prepared transactions
// survive both. It returns once the server accepts connections again. A server that has not
// shut down after a minute (a fast shutdown waits for the clients of its walsenders to confirm
// what they were sent) is an error: Restart then stops it with an immediate shutdown (or
// SIGKILL), starts it again and returns that error, so that a test sees the hang.
func (c *Cluster) Restart(mode string) error {
	if mode != "fast" && mode != "immediate" {
		return fmt.Errorf("pgtest: Restart(%q): want fast or immediate", mode)
	}
	if c.stopped.Load() {
		return errors.New("pgtest: Restart of a stopped cluster")
	}
	_, err := c.Halt(mode, restartTimeout)
	if err == nil {
		return c.Boot()
	}
	how := "an immediate shutdown"
	if _, ierr := c.Halt("immediate", 10*time.Second); ierr != nil {
		how = "SIGKILL"
		c.kill()
	}
	if berr := c.Boot(); berr != nil {
		return errors.Join(fmt.Errorf("pgtest: Restart(%q): %w (stopped with %s)", mode, err, how), berr)
	}
	return fmt.Errorf("pgtest: Restart(%q): %w; stopped it with %s and started it again", mode, err, how)
}

// Halt is pg_ctl stop -m MODE ("smart", "fast" or "immediate"; pg_ctl sends the postmaster
// SIGTERM, SIGINT or SIGQUIT and waits for it to remove its postmaster.pid): it runs the
// cluster's pg_ctl with a wait of timeout (rounded up to whole seconds, as pg_ctl -t takes
// them) and waits for the server process to exit. It returns how long the server took, or an
// error when it did not stop within timeout (it is then still shutting down: Halt again, or
// Stop, ends it; a Halt of a server that has stopped returns at once). Boot starts it again
// with the same data directory and port.
//
// The start is not pg_ctl's: pg_ctl start runs the server detached from the caller, and the
// server must stay a child of the test binary, whose parent-death signal ends it when the
// test binary is killed.
func (c *Cluster) Halt(mode string, timeout time.Duration) (time.Duration, error) {
	if mode != "smart" && mode != "fast" && mode != "immediate" {
		return 0, fmt.Errorf("pgtest: Halt(%q): the mode is smart, fast or immediate", mode)
	}
	select {
	case <-c.exited: // stopped already (by an earlier Halt that gave up waiting)
		return 0, nil
	default:
	}
	secs := int((timeout + time.Second - 1) / time.Second)
	cmd := exec.Command(filepath.Join(c.bin, "pg_ctl"), "stop", "-D", c.data, "-m", mode, "-w", "-t", strconv.Itoa(secs))
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred} // pg_ctl, as initdb, refuses to run as root
	cmd.Dir = filepath.Dir(c.data)
	start := time.Now()
	out, err := cmd.CombinedOutput()
	select {
	case <-c.exited: // (pg_ctl fails when the server has gone before it looked)
		return time.Since(start), nil
	default:
	}
	if err != nil {
		return time.Since(start), fmt.Errorf("pgtest: pg_ctl stop -m %s -t %d: the server did not stop within %v: %v: %s",
			mode, secs, timeout, err, strings.TrimSpace(string(out)))
	}
	// pg_ctl returns once postmaster.pid is gone, which the postmaster removes as it exits.
	select {
	case <-c.exited:
		return time.Since(start), nil
	case <-time.After(10 * time.Second):
		return time.Since(start), fmt.Errorf("pgtest: pg_ctl stop -m %s reported the server stopped, but its process has not exited 10 s later", mode)
	}
}

// Boot starts the server again after Halt, on the same data directory and port.
func (c *Cluster) Boot() error {
	select {
	case <-c.exited:
	default:
		return errors.New("pgtest: Boot: the server is still running")
	}
	return c.startServer(c.bin, c.data, c.cred)
}

// CreateDB creates a fresh database named after prefix (made unique) and returns its DSN.
// Tests use one database each, so they never see each other's tables, publications or
// prepared transactions (replication slots are per cluster: name them uniquely too).
func (c *Cluster) CreateDB(ctx context.Context, prefix string) (string, error) {
	name := fmt.Sprintf("%s_%d", sanitize(prefix), c.dbs.Add(1))
	conn, err := pgx.Connect(ctx, c.DSN("postgres"))
	if err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return "", fmt.Errorf("pgtest: create database %s: %w", name, err)
	}
	return c.DSN(name), nil
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') || r == '_' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	out := b.String()
	if out == "" || (out[0] >= '0' && out[0] <= '9') {
		out = "db_" + out
	}
	if len(out) > 40 {
		out = out[:40]
	}
	return out
}
