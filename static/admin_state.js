// The admin page's state, shared by admin_page.js and admin_sequences.js. The browser tests read it too:
// `(await import("/static/admin_state.js")).state`.
export const state = {
  // the feed's samples of the last HISTORY_S seconds (what the charts draw) and the feed's clock
  points: [],
  nowS: 0,
  // the last sample's pool (block states, sequences)
  lastPool: null,
  // the sequence whose blocks the map outlines, or null
  selected: null,
  // the feed's view of the block map: {start, end} (null: the whole pool), seq (the marked sequence, or null) and,
  // with replicas, the replica the page shows (null: the first); setView(view) reconnects the feed with it
  view: { start: null, end: null, seq: null, replica: null },
  // with replicas: the replica the last sample showed (null: one engine)
  replica: null,
  setView: () => {},
  // what was last drawn, to skip redrawing the same
  adviceJson: "",
  seqsJson: "",
  // the BlockMap and the LineCharts by name
  map: null,
  charts: {},
};
