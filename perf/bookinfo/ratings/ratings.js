// ratings: star ratings per product as JSON, on Node.js's built-in http module, port 9080.
// Written for this project in the shape of Bookinfo's ratings service (same routes and JSON);
// see perf/bookinfo/README.md for what is and is not reproduced.
//
//   node ratings.js [port]     GET /ratings/<id>, GET /health, GET /internal/requests
// BOOKINFO_ARRIVALS=<file>: each counted request appends its arrival time (seconds since the
// epoch) to that file, one per line.
'use strict';
const fs = require('fs');
const http = require('http');

const port = Number(process.argv[2] || process.env.PORT || 9080);
// Requests served, and how many came from loopback (through a local proxy): the lab's hop check.
const counts = { requests: 0, from_loopback: 0 };
const arrivals = process.env.BOOKINFO_ARRIVALS ? fs.openSync(process.env.BOOKINFO_ARRIVALS, 'a') : null;

function reply(res, status, body) {
  const data = JSON.stringify(body);
  res.writeHead(status, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(data) });
  res.end(data);
}

const server = http.createServer((req, res) => {
  const path = req.url.split('?')[0];
  if (path === '/health') return reply(res, 200, { status: 'Ratings is healthy' });
  if (path === '/internal/requests') return reply(res, 200, counts);
  counts.requests += 1;
  if (arrivals !== null) fs.writeSync(arrivals, (Date.now() / 1000).toFixed(6) + '\n');
  const peer = req.socket.remoteAddress || '';
  if (peer.startsWith('127.') || peer.startsWith('::ffff:127.')) counts.from_loopback += 1;
  const m = /^\/ratings\/([^/]+)$/.exec(path);
  if (req.method !== 'GET' || !m) return reply(res, 404, { error: 'not found' });
  if (!/^[0-9]+$/.test(m[1])) return reply(res, 400, { error: 'please provide numeric product ID' });
  return reply(res, 200, { id: Number(m[1]), ratings: { Reviewer1: 5, Reviewer2: 4 } });
});
// Idle keep-alive connections from reviews' pool live longer than Node's 5 s default, so a
// pooled connection is not closed under a caller that is about to reuse it.
server.keepAliveTimeout = 60000;
server.headersTimeout = 65000;
server.listen(port, '0.0.0.0');
for (const sig of ['SIGINT', 'SIGTERM']) process.on(sig, () => server.close(() => process.exit(0)));
