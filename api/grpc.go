package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/palrun/pal/event"
	palv1 "github.com/palrun/pal/proto/pal/v1"
	"github.com/palrun/pal/runs"
)

// maxGRPCRequestBytes bounds a gRPC request message; both requests are a
// run id and a seq.
const maxGRPCRequestBytes = 4 << 10

// grpcRuns serves pal.v1.RunService (proto/pal/v1/run.proto) on the REST
// address: the handler hands it HTTP/2 requests whose content type is
// application/grpc.
type grpcRuns struct {
	palv1.UnimplementedRunServiceServer
	h *handler
}

// newGRPCServer returns the gRPC server of h: bearer tokens as on REST,
// checked by interceptors, and every call needing scope read.
func newGRPCServer(h *handler) *grpc.Server {
	srv := grpc.NewServer(
		grpc.MaxRecvMsgSize(maxGRPCRequestBytes),
		grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
			ctx, err := h.grpcAuth(ctx)
			if err != nil {
				return nil, err
			}
			return next(ctx, req)
		}),
		grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, next grpc.StreamHandler) error {
			ctx, err := h.grpcAuth(ss.Context())
			if err != nil {
				return err
			}
			return next(srv, &authedStream{ServerStream: ss, ctx: ctx})
		}),
	)
	palv1.RegisterRunServiceServer(srv, &grpcRuns{h: h})
	return srv
}

// withGRPC routes gRPC requests (HTTP/2, content type application/grpc)
// to srv and everything else to next.
func withGRPC(srv *grpc.Server, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if isGRPC(r) {
			srv.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// isGRPC reports whether r is a gRPC call.
func isGRPC(r *http.Request) bool {
	return r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc")
}

type authedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *authedStream) Context() context.Context { return s.ctx }

// grpcAuth checks the call's "authorization: Bearer <token>" metadata the
// way requireToken and need(ScopeRead) check REST requests.
func (h *handler) grpcAuth(ctx context.Context) (context.Context, error) {
	if len(h.auth.digests) == 0 {
		if h.cfg.Insecure {
			return withPrincipal(ctx, insecurePrincipal), nil
		}
		return nil, status.Error(codes.Unauthenticated, "this server has no API tokens configured (set PAL_API_TOKENS)")
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) != 1 {
		return nil, status.Error(codes.Unauthenticated, "missing bearer token: send the metadata 'authorization: Bearer <token>' with a token from PAL_API_TOKENS")
	}
	scheme, tok, ok := strings.Cut(vals[0], " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return nil, status.Error(codes.Unauthenticated, "malformed authorization metadata: want 'Bearer <token>'")
	}
	who, ok := h.auth.check(tok)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "invalid bearer token")
	}
	if !who.scopes.Has(ScopeRead) {
		return nil, status.Errorf(codes.PermissionDenied, "token %s lacks scope %s", who.name, ScopeRead)
	}
	return withPrincipal(ctx, who), nil
}

// grpcError maps an error to the gRPC code of its answer code (the one
// table, answerCodes, REST's fail maps to HTTP with).
func (g *grpcRuns) grpcError(id string, err error) error {
	if _, ok := status.FromError(err); ok && !errors.Is(err, context.Canceled) {
		return err
	}
	code, field := answerCode(err)
	detail := err.Error()
	switch code {
	case runs.CodeBadInput:
		if field != "" && !strings.HasPrefix(detail, field+":") {
			detail = field + ": " + detail
		}
	case runs.CodeNotFound:
		detail = fmt.Sprintf("run %s not found", id)
	case runs.CodeUnavailable:
		if errors.Is(err, context.Canceled) {
			return status.Error(codes.Canceled, detail)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			detail = "timed out talking to NATS JetStream: " + detail
		}
		g.h.log.Warn("grpc request failed", "run_id", id, "err", err)
	case runs.CodeInternal:
		g.h.log.Error("grpc request failed for good", "run_id", id, "err", err)
	}
	_, tc := transportOf(code)
	return status.Error(tc.grpc, detail)
}

func validRunID(id string) error {
	if err := event.ValidateRunID(id); err != nil {
		return status.Errorf(codes.InvalidArgument, "run_id: %v", err)
	}
	return nil
}

// GetRun returns the run's read model, the body of REST GET /v1/runs/{id}
// (runView: a run whose journal retention removed reads from its rows).
func (g *grpcRuns) GetRun(ctx context.Context, req *palv1.GetRunRequest) (*palv1.Run, error) {
	id := req.GetRunId()
	if err := validRunID(id); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	v, err := runView(ctx, g.h.client, g.h.rows, g.h.log, id)
	if err != nil {
		return nil, g.grpcError(id, err)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, status.Errorf(codes.Internal, "encoding the run: %v", err)
	}
	return &palv1.Run{RunId: v.RunID, Workflow: v.Workflow, Status: string(v.Status), LastSeq: v.LastSeq,
		View: bytes.TrimRight(buf.Bytes(), "\n")}, nil
}

// StreamRunEvents sends the run's events after after_seq exactly once in
// seq order, then follows it live until its terminal event, the way the
// REST event stream does (runStream: the journal read in pages at the
// client's pace, then the run's shared feed; a corrupt journal ends after
// its sound events). A stream asked to start at or after a finished run's
// end ends at once with no events. A token over its streams' rate or
// with too many open is refused RESOURCE_EXHAUSTED. With include_deltas
// it interleaves the run's deltas (withDeltas, deltaProto).
func (g *grpcRuns) StreamRunEvents(req *palv1.StreamRunEventsRequest, stream palv1.RunService_StreamRunEventsServer) error {
	id := req.GetRunId()
	if err := validRunID(id); err != nil {
		return err
	}
	ctx := stream.Context()
	release, err := g.h.admitStream(ctx)
	if err != nil {
		return g.grpcError(id, err)
	}
	defer release()
	st, err := g.h.openStream(ctx, id, req.GetAfterSeq())
	if errors.Is(err, errStreamEnded) {
		return nil
	}
	if err != nil {
		return g.grpcError(id, err)
	}
	defer st.close()
	out := sink{send: func(ev event.Event) error { return stream.Send(eventProto(ev)) }}
	if req.GetIncludeDeltas() {
		var stop func()
		out, stop = g.h.withDeltas(ctx, id, out, func(d event.Delta) error { return stream.Send(deltaProto(id, d)) })
		defer stop()
	}
	err = st.run(ctx, out)
	var gap *gapError
	var fe *feedError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &gap):
		return status.Error(codes.Aborted, err.Error()+"; resume from the last seq received")
	case errors.As(err, &fe) && ctx.Err() == nil:
		return status.Errorf(codes.Unavailable, "following run %s: %v; resume from the last seq received", id, fe.err)
	case errors.Is(err, errShuttingDown):
		return status.Error(codes.Unavailable, "the server is shutting down; resume from the last seq received")
	case ctx.Err() != nil:
		return status.FromContextError(ctx.Err()).Err()
	}
	if _, ok := status.FromError(err); ok {
		return err // the stream's own (Send)
	}
	return g.grpcError(id, err)
}

// deltaProto is d as an Event of kind "delta" (seq 0, data the delta's
// JSON), as StreamRunEvents sends it with include_deltas.
func deltaProto(runID string, d event.Delta) *palv1.Event {
	data, _ := json.Marshal(d) // a Delta always marshals
	return &palv1.Event{V: event.Version, RunId: runID, Kind: deltaKind, StepId: d.StepID, Attempt: int32(d.Attempt), Data: data}
}

// deltaKind is the kind of a delta among a stream's events.
const deltaKind = "delta"

// eventProto is ev as the protobuf envelope.
func eventProto(ev event.Event) *palv1.Event {
	return &palv1.Event{
		V: int32(ev.V), RunId: ev.RunID, Seq: ev.Seq, Kind: string(ev.Kind),
		Ts: ev.TS.UTC().Format(time.RFC3339Nano), StepId: ev.StepID, Attempt: int32(ev.Attempt),
		WorkerId: ev.WorkerID, TraceId: ev.TraceID, Prev: ev.Prev, Data: []byte(ev.Data),
	}
}
