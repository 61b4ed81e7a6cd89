package amqp

import (
	"context"
	"fmt"
	"net"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// dialBroker opens a connection to the broker at rawURL, named name in the broker's connection list,
// with 10 s heartbeats. The TCP connect and the AMQP handshake are bounded by dialTimeout and
// by ctx; with cutOnDone, the connection is also cut when ctx is done (a consumer's context,
// which Close cancels).
func dialBroker(ctx context.Context, rawURL, name string, cutOnDone bool) (*amqp091.Connection, error) {
	props := amqp091.NewConnectionProperties()
	props.SetClientConnectionName(name)
	conn, err := amqp091.DialConfig(rawURL, amqp091.Config{
		Heartbeat:  10 * time.Second,
		Locale:     "en_US",
		Properties: props,
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: dialTimeout}
			nc, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// Bound the handshake (amqp091 clears the deadline once it is done).
			nc.SetDeadline(time.Now().Add(dialTimeout))
			if cutOnDone {
				context.AfterFunc(ctx, func() { nc.Close() })
			}
			return nc, nil
		},
	})
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", redact(rawURL), err)
	}
	return conn, nil
}
