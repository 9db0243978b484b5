package testenv

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one scrape of a Prometheus endpoint, parsed.
type Metrics map[string]*dto.MetricFamily

// Scrape GETs url (a /metrics endpoint) with header and parses the text
// format. It fails the test unless the answer is 200 and parses.
func Scrape(tb testing.TB, url string, header http.Header) Metrics {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("scraping %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("scraping %s: HTTP %d", url, resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		tb.Fatalf("parsing the scrape of %s: %v", url, err)
	}
	return fams
}

// Value is the value of the series of metric name with exactly labels (as
// "k=v" pairs): a counter's or gauge's value, a histogram's sample count.
// ok is false when there is no such series.
func (m Metrics) Value(name string, labels ...string) (v float64, ok bool) {
	s, ok := m.series(name, labels)
	if !ok {
		return 0, false
	}
	switch {
	case s.Counter != nil:
		return s.Counter.GetValue(), true
	case s.Gauge != nil:
		return s.Gauge.GetValue(), true
	case s.Histogram != nil:
		return float64(s.Histogram.GetSampleCount()), true
	case s.Untyped != nil:
		return s.Untyped.GetValue(), true
	}
	return 0, false
}

// Sum is a histogram's sample sum (0, false when there is no such series).
func (m Metrics) Sum(name string, labels ...string) (float64, bool) {
	s, ok := m.series(name, labels)
	if !ok || s.Histogram == nil {
		return 0, false
	}
	return s.Histogram.GetSampleSum(), true
}

func (m Metrics) series(name string, labels []string) (*dto.Metric, bool) {
	fam := m[name]
	if fam == nil {
		return nil, false
	}
	want := map[string]bool{}
	for _, l := range labels {
		want[l] = true
	}
	for _, s := range fam.GetMetric() {
		if len(s.GetLabel()) != len(want) {
			continue
		}
		match := true
		for _, lp := range s.GetLabel() {
			if !want[fmt.Sprintf("%s=%s", lp.GetName(), lp.GetValue())] {
				match = false
			}
		}
		if match {
			return s, true
		}
	}
	return nil, false
}
