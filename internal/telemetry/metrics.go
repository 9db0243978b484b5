package telemetry

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Registry holds every PAL metric of this process (and the Go and process
// collectors). Handler serves it.
var Registry = prometheus.NewRegistry()

// durations are the buckets of the step, drive and recovery histograms:
// from a millisecond to ten minutes.
var durations = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

var (
	runsStarted = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pal_runs_started_total", Help: "Runs started: each run once, by the worker process that drives it first, whichever process created it."})
	runsFinished = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pal_runs_finished_total", Help: "Runs ended (terminal event appended by this process), by status."}, []string{"status"})
	appendSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "pal_append_duration_seconds", Help: "Latency of fenced appends to the journal, by result (ok, conflict, error).",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}}, []string{"result"})
	steps = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pal_steps_total", Help: "Step attempts, by node type and outcome (completed, failed, retrying, waiting, interrupted)."},
		[]string{"node_type", "outcome"})
	stepSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "pal_step_duration_seconds", Help: "Duration of step attempts in a drive, by node type and outcome.", Buckets: durations},
		[]string{"node_type", "outcome"})
	drives = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pal_drives_total", Help: "Drives (one worker's turn at a run), by outcome."}, []string{"outcome"})
	driveSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "pal_drive_duration_seconds", Help: "Duration of drives, lease wait included, by outcome.", Buckets: durations},
		[]string{"outcome"})
	takeovers = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pal_lease_takeovers_total", Help: "Drives that resumed a run whose previous drive was interrupted (crashed, killed, lost its lease)."})
	resumeGap = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "pal_resume_after_interruption_seconds", Help: "Time from an interrupted drive's last journaled event to the next run_resumed.",
		Buckets: durations})
	projectorLag = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pal_projector_lag_seconds", Help: "Age of the newest event in the projector's last committed batch, at commit."}, []string{"projector"})
	projectorBehind = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pal_projector_lag_events", Help: "Messages in PAL_EVENTS after the projector's last committed batch, at commit."}, []string{"projector"})
	providerCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pal_provider_calls_total", Help: "LLM provider calls, by provider, model and result (ok, error)."},
		[]string{"provider", "model", "result"})
	providerSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "pal_provider_call_duration_seconds", Help: "Latency of LLM provider calls, by provider and model.", Buckets: durations},
		[]string{"provider", "model"})
	providerTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pal_provider_tokens_total", Help: "Tokens of LLM provider calls, by provider, model and direction: input (all of it) and output, and the parts of them cache_read and cache_write (input read from and written to the prompt cache) and reasoning (output spent thinking)."},
		[]string{"provider", "model", "direction"})
	providerCost = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pal_provider_cost_usd_total", Help: "Estimated cost of LLM provider calls in USD at the run's journaled prices, by provider and model."},
		[]string{"provider", "model"})
	groups = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pal_append_groups_total", Help: "Atomic batches of appends written by strict mode's group commit, by result (committed, failed: its appends were then published one by one)."},
		[]string{"result"})
	grouped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "pal_append_grouped_total", Help: "Appends that landed in a committed group (pal_append_groups_total)."})
	refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pal_commands_refused_total", Help: "Commands refused, by command and reason."}, []string{"command", "reason"})
)

func init() {
	Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		runsStarted, runsFinished, appendSeconds, steps, stepSeconds, drives, driveSeconds, takeovers, resumeGap,
		projectorLag, projectorBehind, providerCalls, providerSeconds, providerTokens, providerCost, groups, grouped, refused, consumerMetrics, queuedMetrics)
}

// Handler serves Registry in the Prometheus text format.
func Handler() http.Handler {
	return promhttp.HandlerFor(Registry, promhttp.HandlerOpts{Registry: Registry, Timeout: 10 * time.Second})
}

// Appended records one append to the journal: how long it took, and, when
// it landed, the runs it ended. kinds are the appended events' kinds as
// the journal spells them. A start is counted by RunStarted: the process
// that appends run_created may be a one-shot pal command nothing scrapes.
func Appended(took time.Duration, result string, kinds []string) {
	appendSeconds.WithLabelValues(result).Observe(took.Seconds())
	if result != "ok" {
		return
	}
	for _, k := range kinds {
		switch k {
		case "run_succeeded":
			runsFinished.WithLabelValues("succeeded").Inc()
		case "run_failed":
			runsFinished.WithLabelValues("failed").Inc()
		case "run_cancelled":
			runsFinished.WithLabelValues("cancelled").Inc()
		}
	}
}

// RunStarted counts a run's first drive landing, on the worker that made
// it: every run is counted once, wherever it was started.
func RunStarted() { runsStarted.Inc() }

// GroupWritten counts one atomic batch of n appends, committed or not.
func GroupWritten(n int, committed bool) {
	if !committed {
		groups.WithLabelValues("failed").Inc()
		return
	}
	groups.WithLabelValues("committed").Inc()
	grouped.Add(float64(n))
}

// DriveEnded counts a drive by its outcome and duration.
func DriveEnded(outcome string, took time.Duration) {
	drives.WithLabelValues(outcome).Inc()
	driveSeconds.WithLabelValues(outcome).Observe(took.Seconds())
}

// Takeover counts a drive that resumed a run after an interrupted drive;
// gap is the time since that drive's last journaled event.
func Takeover(gap time.Duration) {
	takeovers.Inc()
	resumeGap.Observe(max(gap, 0).Seconds())
}

// ProjectorCommitted records the projector's lag after it committed a
// batch: the age of the batch's newest message and how many follow it.
func ProjectorCommitted(projector string, age time.Duration, behind uint64) {
	projectorLag.WithLabelValues(projector).Set(max(age, 0).Seconds())
	projectorBehind.WithLabelValues(projector).Set(float64(behind))
}

// Refused counts a refused command; reason is a short code (bad_input,
// not_found, run_finished, …).
func Refused(command, reason string) {
	refused.WithLabelValues(command, reason).Inc()
}

// bounded keeps label values that come from outside (models, providers
// named in workflows) from growing a metric without limit: values are cut
// to maxLabelLen bytes, and once maxLabelValues distinct values have been
// seen, any new one is counted as "other".
type bounded struct {
	mu   sync.Mutex
	seen map[string]bool
}

const (
	maxLabelValues = 64
	maxLabelLen    = 64
)

func (b *bounded) value(v string) string {
	if len(v) > maxLabelLen {
		v = v[:maxLabelLen]
	}
	if v == "" {
		return "unknown"
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seen == nil {
		b.seen = map[string]bool{}
	}
	if b.seen[v] {
		return v
	}
	if len(b.seen) >= maxLabelValues {
		return "other"
	}
	b.seen[v] = true
	return v
}

var models, providers bounded

// consumerProbe reports one JetStream consumer's pending counts.
type consumerProbe struct {
	stream, name string
	info         func(ctx context.Context) (*jetstream.ConsumerInfo, error)
}

// consumerCollector asks, on each scrape, every consumer this process
// consumes from for its info, all at once, each within consumerTimeout.
type consumerCollector struct {
	mu     sync.Mutex
	probes map[*consumerProbe]struct{}
}

var consumerMetrics = &consumerCollector{probes: map[*consumerProbe]struct{}{}}

const consumerTimeout = 2 * time.Second

var (
	pendingDesc = prometheus.NewDesc("pal_consumer_pending_messages",
		"Messages of the stream not yet delivered to the consumer (JetStream num_pending), read at scrape.",
		[]string{"stream", "consumer"}, nil)
	ackPendingDesc = prometheus.NewDesc("pal_consumer_ack_pending_messages",
		"Messages delivered to the consumer and not yet acknowledged (num_ack_pending), read at scrape.",
		[]string{"stream", "consumer"}, nil)
	probeErrorDesc = prometheus.NewDesc("pal_consumer_info_errors",
		"1 when the consumer's info could not be read at this scrape (NATS down, timeout).",
		[]string{"stream", "consumer"}, nil)
)

// WatchConsumer has every scrape report the pending counts of the
// durable consumer stream/name, read with one consumer info request
// through js. The returned func stops it. A process watches the consumers
// it consumes from, whose info its NATS role may read.
func WatchConsumer(js jetstream.JetStream, stream, name string) (stop func()) {
	p := &consumerProbe{stream: stream, name: name, info: func(ctx context.Context) (*jetstream.ConsumerInfo, error) {
		c, err := js.Consumer(ctx, stream, name)
		if err != nil {
			return nil, err
		}
		return c.CachedInfo(), nil
	}}
	consumerMetrics.mu.Lock()
	consumerMetrics.probes[p] = struct{}{}
	consumerMetrics.mu.Unlock()
	return func() {
		consumerMetrics.mu.Lock()
		delete(consumerMetrics.probes, p)
		consumerMetrics.mu.Unlock()
	}
}

func (c *consumerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- pendingDesc
	ch <- ackPendingDesc
	ch <- probeErrorDesc
}

func (c *consumerCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	probes := make([]*consumerProbe, 0, len(c.probes))
	for p := range c.probes {
		probes = append(probes, p)
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), consumerTimeout)
	defer cancel()
	var wg sync.WaitGroup
	seen := sync.Map{} // one series per stream/consumer even if watched twice
	for _, p := range probes {
		if _, dup := seen.LoadOrStore(p.stream+"\x00"+p.name, true); dup {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ci, err := p.info(ctx)
			if err == nil && ci == nil {
				err = errors.New("no consumer info")
			}
			failed := 0.0
			if err != nil {
				failed = 1
			} else {
				ch <- prometheus.MustNewConstMetric(pendingDesc, prometheus.GaugeValue, float64(ci.NumPending), p.stream, p.name)
				ch <- prometheus.MustNewConstMetric(ackPendingDesc, prometheus.GaugeValue, float64(ci.NumAckPending), p.stream, p.name)
			}
			ch <- prometheus.MustNewConstMetric(probeErrorDesc, prometheus.GaugeValue, failed, p.stream, p.name)
		}()
	}
	wg.Wait()
}

// queuedDesc is the runs waiting for a worker of their queue.
var queuedDesc = prometheus.NewDesc("pal_runs_queued",
	"Runs created and not yet taken by a worker (status queued in the projection), by work queue, read at scrape.",
	[]string{"queue"}, nil)

// queuedCollector reports pal_runs_queued from the source the API server
// set (SetQueuedSource): the Postgres projection's count by queue.
type queuedCollector struct {
	mu     sync.Mutex
	source func(ctx context.Context) (map[string]int64, error)
}

var queuedMetrics = &queuedCollector{}

// SetQueuedSource makes every scrape report pal_runs_queued from source
// (nil: none); the process serving /metrics with a projection sets it.
func SetQueuedSource(source func(ctx context.Context) (map[string]int64, error)) {
	queuedMetrics.mu.Lock()
	queuedMetrics.source = source
	queuedMetrics.mu.Unlock()
}

func (c *queuedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- queuedDesc }

func (c *queuedCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	source := c.source
	c.mu.Unlock()
	if source == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), consumerTimeout)
	defer cancel()
	counts, err := source(ctx)
	if err != nil {
		return
	}
	for q, n := range counts {
		ch <- prometheus.MustNewConstMetric(queuedDesc, prometheus.GaugeValue, float64(n), q)
	}
}
