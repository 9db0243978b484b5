package testenv

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSCluster is a JetStream cluster of nats-server processes on loopback,
// for tests that kill -9 a stream's leader. Each node keeps its ports and
// store directory across Kill and Start.
type NATSCluster struct {
	Nodes []*NATSProc
	// names are the nodes' server names (node1…), as stream infos name
	// their leaders.
	names []string
}

// ClusterOption changes how NATSClusterProcesses starts its nodes.
type ClusterOption func(*clusterConfig)

type clusterConfig struct{ fastRaft bool }

// FastRaft runs the nodes with PAL's raft timing (natsraft.Fast, the
// timing of pal dev --cluster's nodes) instead of stock nats-server's: the
// binary is internal/cmd/natsnode, nats-server with that timing set.
func FastRaft() ClusterOption { return func(c *clusterConfig) { c.fastRaft = true } }

// NATSClusterProcesses starts n nats-server processes (built like
// NATSProcess's) as one JetStream cluster named pal: each listens on
// 127.0.0.1 on a free client port and a free route port, with its store in
// a fresh t.TempDir(), and routes to the others. It returns once every
// node's JetStream answers, which needs the cluster's meta leader. The
// test's cleanup kills them.
func NATSClusterProcesses(tb testing.TB, n int, opts ...ClusterOption) *NATSCluster {
	tb.Helper()
	if n < 3 {
		tb.Fatalf("testenv: a JetStream cluster needs at least 3 nodes, not %d", n)
	}
	var cfg clusterConfig
	for _, o := range opts {
		o(&cfg)
	}
	bin := natsServerBinary(tb)
	if cfg.fastRaft {
		bin = BuildBinary(tb, "./internal/cmd/natsnode")
	}
	c := &NATSCluster{}
	routes := make([]string, n)
	clientPorts := make([]int, n)
	for i := range n {
		clientPorts[i] = FreePort(tb)
		routes[i] = "nats://127.0.0.1:" + strconv.Itoa(FreePort(tb))
	}
	for i := range n {
		name := fmt.Sprintf("node%d", i+1)
		dir := tb.TempDir()
		args := []string{"-js", "-sd", filepath.Join(dir, "store"), "-a", "127.0.0.1", "-n", name,
			"-p", strconv.Itoa(clientPorts[i]), "--cluster_name", "pal", "--cluster", routes[i],
			"--routes", strings.Join(routes, ",")}
		c.Nodes = append(c.Nodes, &NATSProc{bin: bin, args: args, url: "nats://127.0.0.1:" + strconv.Itoa(clientPorts[i])})
		c.names = append(c.names, name)
	}
	// Every node starts before any can be ready: JetStream answers only
	// once a quorum has elected the meta leader.
	procs := make([]*Process, n)
	for i, node := range c.Nodes {
		procs[i] = StartProcess(tb, node.bin, node.args, nil)
	}
	ctx, cancel := context.WithTimeout(context.Background(), natsProcReady)
	defer cancel()
	for i, node := range c.Nodes {
		if err := waitJetStream(ctx, node.url, procs[i]); err != nil {
			tb.Fatalf("testenv: cluster node %s on %s: %v\noutput:\n%s", c.names[i], node.url, err, tail(procs[i].Output(), 4000))
		}
		node.mu.Lock()
		node.proc = procs[i]
		node.mu.Unlock()
	}
	return c
}

// URLs returns every node's client URL, comma-separated, as PAL_NATS_URL
// takes them.
func (c *NATSCluster) URLs() string {
	urls := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		urls[i] = n.url
	}
	return strings.Join(urls, ",")
}

// Conn connects to the cluster (any node, reconnecting to the others),
// closed by the test's cleanup.
func (c *NATSCluster) Conn(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return connect(tb, c.URLs(), opts)
}

// Name returns node's server name.
func (c *NATSCluster) Name(node *NATSProc) string {
	for i, n := range c.Nodes {
		if n == node {
			return c.names[i]
		}
	}
	return ""
}

// LeaderOf returns the node that leads stream (for a KV bucket, its
// stream KV_<bucket>), asking until one is elected or ctx ends.
func (c *NATSCluster) LeaderOf(ctx context.Context, js jetstream.JetStream, stream string) (*NATSProc, error) {
	for {
		leader, err := c.leader(ctx, js, stream)
		if err == nil {
			return leader, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("leader of %s: %w (last: %v)", stream, ctx.Err(), err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (c *NATSCluster) leader(ctx context.Context, js jetstream.JetStream, stream string) (*NATSProc, error) {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := js.Stream(rctx, stream)
	if err != nil {
		return nil, err
	}
	info, err := s.Info(rctx)
	if err != nil {
		return nil, err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return nil, errors.New("no leader")
	}
	for i, name := range c.names {
		if name == info.Cluster.Leader {
			return c.Nodes[i], nil
		}
	}
	return nil, fmt.Errorf("leader %q is no node of this cluster", info.Cluster.Leader)
}

// WaitCurrent waits until each stream has a leader and every replica is
// current (caught up and recently active), so the next kill cannot lose a
// quorum.
func (c *NATSCluster) WaitCurrent(ctx context.Context, js jetstream.JetStream, streams ...string) error {
	for _, stream := range streams {
		for {
			err := c.current(ctx, js, stream)
			if err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("stream %s not current: %w (last: %v)", stream, ctx.Err(), err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

func (c *NATSCluster) current(ctx context.Context, js jetstream.JetStream, stream string) error {
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := js.Stream(rctx, stream)
	if err != nil {
		return err
	}
	info, err := s.Info(rctx)
	if err != nil {
		return err
	}
	if info.Cluster == nil || info.Cluster.Leader == "" {
		return errors.New("no leader")
	}
	if len(info.Cluster.Replicas) != len(c.Nodes)-1 {
		return fmt.Errorf("%d replicas besides the leader", len(info.Cluster.Replicas))
	}
	for _, r := range info.Cluster.Replicas {
		if !r.Current || r.Offline {
			return fmt.Errorf("replica %s is not current", r.Name)
		}
	}
	return nil
}
