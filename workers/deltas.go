package workers

import (
	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/provider"
)

// deltas is where an LLM step's answer streams as the provider writes it.
func (d *drive) deltas(engine.StepPlan) provider.Sink { return nil }
