package event_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
)

func TestValidateRunID(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		id   string
		ok   bool
		want string // part of the error
	}{
		{"ulid run id", "run_01HZX3K7Q9V2M8N4P6R5T1W0YB", true, ""},
		{"one letter", "a", true, ""},
		{"one digit", "7", true, ""},
		{"underscore", "_", true, ""},
		{"dash", "-", true, ""},
		{"all classes", "Run_2024-abc_XYZ-09", true, ""},
		{"128 characters", strings.Repeat("a", 128), true, ""},
		{"empty", "", false, "empty"},
		{"129 characters", strings.Repeat("a", 129), false, "longer than 128"},
		{"dot", "run.1", false, "'.'"},
		{"only a dot", ".", false, "'.'"},
		{"star", "*", false, "'*'"},
		{"gt", ">", false, "'>'"},
		{"wildcard suffix", "run_a.>", false, "not allowed"},
		{"space", "run 1", false, "' '"},
		{"leading space", " run", false, "' '"},
		{"tab", "run\t1", false, "'\\t'"},
		{"newline", "run\n", false, "'\\n'"},
		{"slash", "run/1", false, "'/'"},
		{"colon", "run:1", false, "':'"},
		{"pipe", "run|1", false, "'|'"},
		{"dollar", "$KV", false, "'$'"},
		{"unicode letter", "rün", false, "'ü'"},
		{"unicode digit", "run_١", false, "not allowed"},
		{"invalid utf-8", "run\xff", false, "not allowed"},
		{"nul", "run\x00", false, "not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := event.ValidateRunID(tt.id)
			if tt.ok {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.ErrorContains(t, err, "invalid run id")
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestValidateRunIDTruncatesLongIDs(t *testing.T) {
	t.Parallel()
	err := event.ValidateRunID(strings.Repeat("ü", 100))
	require.Error(t, err)
	require.Less(t, len(err.Error()), 200, "the error quotes a prefix of the id, not all of it")
	require.NotContains(t, err.Error(), "\\x", "the quoted prefix is valid UTF-8")
}

func TestNewRunID(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		id := event.NewRunID()
		require.NoError(t, event.ValidateRunID(id))
		require.True(t, strings.HasPrefix(id, "run_"), id)
		require.Len(t, id, len("run_")+26)
		require.False(t, seen[id], "duplicate run id %s", id)
		seen[id] = true
	}
}

func TestChildRunID(t *testing.T) {
	t.Parallel()
	// Known vector: printf 'run_parent|spawn' | sha256sum, first 13 bytes.
	require.Equal(t, "run_c0bb2d0f4135ebb68d18b3a3208", event.ChildRunID("run_parent", "spawn"))

	parent := event.NewRunID()
	a := event.ChildRunID(parent, "research")
	require.Equal(t, a, event.ChildRunID(parent, "research"), "deterministic")
	require.NoError(t, event.ValidateRunID(a))
	require.NotEqual(t, a, event.ChildRunID(parent, "write"))
	require.NotEqual(t, a, event.ChildRunID(event.NewRunID(), "research"))
	// Step ids may hold characters run ids may not; the child id is safe.
	c := event.ChildRunID(parent, "loop[3].fetch step/ü")
	require.NoError(t, event.ValidateRunID(c))
	// A child of a child stays valid and bounded.
	require.NoError(t, event.ValidateRunID(event.ChildRunID(c, "inner")))
	require.Len(t, c, len(a))
}

// A schedule's tick names one run, a valid subject token, whichever
// location the tick's time is written in; another tick or schedule names
// another.
func TestScheduleRunID(t *testing.T) {
	t.Parallel()
	tick := time.Date(2026, 12, 5, 3, 0, 0, 0, time.UTC)
	id := event.ScheduleRunID("nightly", tick)
	require.NoError(t, event.ValidateRunID(id))
	require.True(t, strings.HasPrefix(id, "run_s"))
	berlin, err := time.LoadLocation("Europe/Berlin")
	require.NoError(t, err)
	require.Equal(t, id, event.ScheduleRunID("nightly", tick.In(berlin)))
	require.NotEqual(t, id, event.ScheduleRunID("nightly", tick.Add(time.Second)))
	require.NotEqual(t, id, event.ScheduleRunID("nightly2", tick))
	require.Equal(t, "2026-12-05T03:00:00Z", event.FormatTick(tick.In(berlin)))
}
