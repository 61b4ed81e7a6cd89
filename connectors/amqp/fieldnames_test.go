package amqp

import (
	"context"
	"strings"
	"testing"
)

// With FieldNames, configuration errors name what the program maps the fields to (its flags);
// without, the Go field (TestBadConfig).
func TestFieldNamesInErrors(t *testing.T) {
	names := map[string]string{"Prefetch": "flag -prefetch", "Queue": "flag -queue", "ReconnectMin": "flag -reconnect-min", "ReconnectMax": "flag -reconnect-max"}
	for _, c := range []struct {
		cfg  SourceConfig
		want string
	}{
		{SourceConfig{FieldNames: names}, "flag -queue is empty"},
		{SourceConfig{Queue: "q", Prefetch: 70000, FieldNames: names}, "flag -prefetch is 70000"},
		{SourceConfig{Queue: "q", ReconnectMin: -1, FieldNames: names}, "flag -reconnect-min"},
		{SourceConfig{Queue: "q", ReconnectMin: -1}, "SourceConfig.ReconnectMin"},
	} {
		_, err := NewSource[Message](c.cfg, nil).Parts(context.Background())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error with %q", c.cfg, err, c.want)
		}
		if c.cfg.FieldNames != nil && err != nil && strings.Contains(err.Error(), "SourceConfig") {
			t.Errorf("%+v: %v names a Go field", c.cfg, err)
		}
	}
	cfg := SourceConfig{FieldNames: map[string]string{"Declare": ""}}
	if n, ok := cfg.name("Declare"); ok || n != "" {
		t.Errorf("a field mapped to \"\" is offered: %q %v", n, ok)
	}
}
