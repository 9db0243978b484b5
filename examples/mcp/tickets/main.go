// Command tickets is a small MCP server for PAL's examples and tests: a
// ticket tracker kept in one file, with two tools.
//
//   - create_ticket {"title", "body"?} creates a ticket, once per
//     idempotency key: the request's _meta "pal/idempotencyKey" (PAL sends
//     its step's key). A call that comes again with a key already seen
//     answers the ticket it created then. Every call is recorded.
//   - search {"query"} lists the tickets whose title holds query (the
//     call is recorded with its key too).
//
// It serves MCP on stdio, or with -http ADDR on streamable HTTP at
// http://ADDR/mcp. The state is DIR/tickets.json (-dir, required):
//
//	{"tickets": [{"id", "title", "body", "key"}], "calls": [{"tool", "key"}]}
//
// For tests: -hold FILE makes create_ticket wait, after it recorded the
// call and made the ticket, while FILE exists; -crash makes it exit
// before answering; -extra NAME lists one more tool (which answers
// "ok"); -token T makes the HTTP server refuse a request without
// "Authorization: Bearer T".
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// keyMeta is the _meta field PAL sends its step's idempotency key in.
const keyMeta = "pal/idempotencyKey"

type ticket struct {
	ID    int    `json:"id"`
	Title string `json:"title"`
	Body  string `json:"body,omitempty"`
	Key   string `json:"key,omitempty"`
}

type call struct {
	Tool string `json:"tool"`
	Key  string `json:"key"`
}

type state struct {
	Tickets []ticket `json:"tickets"`
	Calls   []call   `json:"calls"`
}

// store is the state file, locked while it is read and written.
type store struct{ path string }

func (s store) update(fn func(*state) error) error {
	lock, err := os.OpenFile(s.path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	var st state
	b, err := os.ReadFile(s.path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return err
	default:
		if err := json.Unmarshal(b, &st); err != nil {
			return fmt.Errorf("%s: %w", s.path, err)
		}
	}
	if err := fn(&st); err != nil {
		return err
	}
	out, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp := s.path + ".tmp"
	if err := os.WriteFile(tmp, out, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, s.path)
}

type createIn struct {
	Title string `json:"title" jsonschema:"the ticket's title"`
	Body  string `json:"body,omitempty" jsonschema:"what the ticket is about"`
}

type searchIn struct {
	Query string `json:"query" jsonschema:"words the title holds"`
}

type found struct {
	Tickets []ticket `json:"tickets"`
}

func main() {
	dir := flag.String("dir", "", "the directory of tickets.json (required)")
	addr := flag.String("http", "", "serve streamable HTTP on this address (at /mcp) instead of stdio")
	hold := flag.String("hold", "", "create_ticket waits while this file exists")
	crash := flag.Bool("crash", false, "create_ticket exits before it answers")
	extra := flag.String("extra", "", "list one more tool of this name")
	token := flag.String("token", "", "with -http, the bearer token a request must carry")
	flag.Parse()
	if *dir == "" {
		fmt.Fprintln(os.Stderr, "tickets: -dir is required")
		os.Exit(2)
	}
	st := store{path: filepath.Join(*dir, "tickets.json")}
	server := mcp.NewServer(&mcp.Implementation{Name: "tickets", Version: "1"}, nil)
	mcp.AddTool(server, &mcp.Tool{Name: "create_ticket", Description: "Create a ticket; answers the ticket."},
		func(ctx context.Context, req *mcp.CallToolRequest, in createIn) (*mcp.CallToolResult, ticket, error) {
			key, _ := req.Params.Meta[keyMeta].(string)
			if strings.TrimSpace(in.Title) == "" {
				return nil, ticket{}, errors.New("title is required")
			}
			var made ticket
			err := st.update(func(s *state) error {
				s.Calls = append(s.Calls, call{Tool: "create_ticket", Key: key})
				for _, t := range s.Tickets {
					if key != "" && t.Key == key {
						made = t // the same call again: the same ticket
						return nil
					}
				}
				made = ticket{ID: len(s.Tickets) + 1, Title: in.Title, Body: in.Body, Key: key}
				s.Tickets = append(s.Tickets, made)
				return nil
			})
			if err != nil {
				return nil, ticket{}, err
			}
			if *crash {
				os.Exit(3)
			}
			for *hold != "" {
				if _, err := os.Stat(*hold); err != nil {
					break
				}
				select {
				case <-ctx.Done():
					return nil, ticket{}, ctx.Err()
				case <-time.After(20 * time.Millisecond):
				}
			}
			return nil, made, nil
		})
	mcp.AddTool(server, &mcp.Tool{Name: "search", Description: "Find tickets by title."},
		func(ctx context.Context, req *mcp.CallToolRequest, in searchIn) (*mcp.CallToolResult, found, error) {
			key, _ := req.Params.Meta[keyMeta].(string)
			out := found{Tickets: []ticket{}}
			err := st.update(func(s *state) error {
				s.Calls = append(s.Calls, call{Tool: "search", Key: key})
				for _, t := range s.Tickets {
					if strings.Contains(strings.ToLower(t.Title), strings.ToLower(in.Query)) {
						out.Tickets = append(out.Tickets, t)
					}
				}
				return nil
			})
			return nil, out, err
		})
	if *extra != "" {
		mcp.AddTool(server, &mcp.Tool{Name: *extra, Description: "An extra tool."},
			func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
				return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "ok"}}}, nil, nil
			})
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *addr == "" {
		if err := server.Run(ctx, &mcp.StdioTransport{}); err != nil && ctx.Err() == nil {
			log.Fatalf("tickets: %v", err)
		}
		return
	}
	mux := http.NewServeMux()
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return server }, nil)
	mux.HandleFunc("/mcp", func(w http.ResponseWriter, r *http.Request) {
		if *token != "" && r.Header.Get("Authorization") != "Bearer "+*token {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
	srv := &http.Server{Addr: *addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	log.Printf("tickets: serving MCP on http://%s/mcp", *addr)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Fatalf("tickets: %v", err)
	}
}
