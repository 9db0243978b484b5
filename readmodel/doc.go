// Package readmodel holds the rows of a run as the read side stores them:
// RunRow, StepRow and ReceiptRow, mapped from a folded run by RowsOf (and
// RunRowOf, StepRowOf, ReceiptRowOf), and RunDetail, a run with its step
// attempts. RunFilter is what a listing selects rows by (runs parses it from
// a query, projections runs it). It is pure: no I/O, no clock.
//
// Both read paths render runs from these rows: the projector writes them to
// Postgres (package projections), and the front door (package runs) renders
// a run folded straight from its journal through the same rows, so the two
// agree on every field without runs linking a Postgres driver.
package readmodel
