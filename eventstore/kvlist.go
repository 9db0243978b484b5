package eventstore

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// eachCurrent passes each current value a KV watch w delivers to each,
// until the watch marks the end of its initial values (a nil entry), each
// says to stop, or ctx ends; it stops the watch. what names the listing
// in errors. It is how a listing reads a bucket's last values in one pass.
func eachCurrent(ctx context.Context, w jetstream.KeyWatcher, what string, each func(jetstream.KeyValueEntry) (more bool, err error)) error {
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("listing %s: the watch ended", what)
			}
			if e == nil {
				return nil
			}
			more, err := each(e)
			if err != nil || !more {
				return err
			}
		}
	}
}
