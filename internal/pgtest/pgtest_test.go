package pgtest

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
)

// A started cluster accepts connections, has the settings logical replication and two-phase
// commit need, makes databases, and is gone after Stop.
func TestStartStop(t *testing.T) {
	c, err := Start()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	ctx := context.Background()
	dsn, err := c.CreateDB(ctx, "Start-Stop")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	for setting, want := range map[string]string{"wal_level": "logical", "max_prepared_transactions": "20", "fsync": "off"} {
		var got string
		if err := conn.QueryRow(ctx, "SELECT current_setting($1)", setting).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("%s = %s, want %s", setting, got, want)
		}
	}
	conn.Close(ctx)
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(c.Dir); !os.IsNotExist(err) {
		t.Errorf("directory %s still there after Stop: %v", c.Dir, err)
	}
	if _, err := pgx.Connect(ctx, c.DSN("postgres")); err == nil {
		t.Error("the server still accepts connections after Stop")
	}
}
