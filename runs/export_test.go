package runs

import "github.com/palrun/pal/workflow"

// SetCommandHook makes p run hook before each command it carries out (set
// it before Start): a test's way to make a handler fail on a given body.
func SetCommandHook(p *CommandProcessor, hook func(kind string, body []byte)) { p.hook = hook }

// LLMWorkflow is the one-node workflow of a plain-LLM run of s.
func LLMWorkflow(s *LLMSpec) (*workflow.Workflow, error) { return s.workflow() }
