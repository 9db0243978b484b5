package runs

import (
	"context"

	"github.com/palrun/pal/internal/limit"
)

// CodeRateLimited: the caller is over one of its limits (limit.Limits):
// nothing was done; try again after the wait the error names (REST 429
// with Retry-After, gRPC RESOURCE_EXHAUSTED). A durable command over its
// limit is refused like any other, not retried.
const CodeRateLimited = "rate_limited"

// WithLimiter has the client hold every caller to lim's rates: a start,
// fork or retry spends one of the caller's starts (limit.Start), any
// other command one of its commands (limit.Command). Over the rate the
// command is refused with a *limit.Error (code rate_limited) before
// anything is read or written. Default: no limits (nil).
func WithLimiter(lim *limit.Limiter) Option { return func(c *Client) { c.limiter = lim } }

// Limiter returns the limiter the client holds callers to (nil: none),
// for the doors that limit more than commands (REST's event streams).
func (c *Client) Limiter() *limit.Limiter { return c.limiter }

type callerKey struct{}

// WithCaller says who sends the commands made with ctx, as the transport
// authenticated it (a REST token's name, a NATS user): the identity whose
// limits they spend. Without it a command spends those of the identity it
// journals (its by, or an approval's approver; a resume, which journals
// none, those of the unnamed caller "").
func WithCaller(ctx context.Context, who string) context.Context {
	return context.WithValue(ctx, callerKey{}, who)
}

// admit spends one of the caller's requests of kind (see WithCaller for
// who that is; named is the identity the command journals). Errors:
// *limit.Error (counted as a refusal).
func (c *Client) admit(ctx context.Context, command string, kind limit.Kind, named string) (err error) {
	if c.limiter == nil {
		return nil
	}
	who, ok := ctx.Value(callerKey{}).(string)
	if !ok {
		who = named
	}
	defer observeRefusal(command, &err)
	return c.limiter.Allow(kind, who)
}
