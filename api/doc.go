// Package api is how users drive PAL besides the durable commands: the
// NATS micro service "pal" (pal.api.runs.*) and the REST + SSE API.
package api
