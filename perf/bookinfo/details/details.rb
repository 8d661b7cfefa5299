# details: book details as JSON, on Ruby's WEBrick (Debian's ruby + ruby-webrick), port 9080.
# Written for this project in the shape of Bookinfo's details service (same routes and JSON);
# see perf/bookinfo/README.md for what is and is not reproduced.
#
#   ruby details.rb [port]        GET /details/<id>, GET /health, GET /internal/requests
#
# DETAILS_TCP_NODELAY=1 (default) sets TCP_NODELAY on accepted sockets, as Bookinfo's details
# does since Istio 1.23; 0 keeps WEBrick's default (Nagle on: the header and body writes of a
# response can wait for the client's delayed ACK). BOOKINFO_ARRIVALS=<file>: each counted request
# appends its arrival time (seconds since the epoch) to that file, one per line.
require 'webrick'
require 'json'
require 'socket'

port = Integer(ARGV[0] || ENV.fetch('PORT', '9080'))
nodelay = ENV.fetch('DETAILS_TCP_NODELAY', '1') != '0'

# Requests served, and how many came from loopback (i.e. through a local proxy): the lab's hop check.
$lock = Mutex.new
$counts = { 'requests' => 0, 'from_loopback' => 0 }
$arrivals = ENV['BOOKINFO_ARRIVALS'] ? File.open(ENV['BOOKINFO_ARRIVALS'], 'a') : nil
$arrivals.sync = true if $arrivals

def count(req)
  now = Time.now.to_f
  loopback = req.peeraddr && req.peeraddr[3].to_s.start_with?('127.')
  $lock.synchronize do
    $counts['requests'] += 1
    $counts['from_loopback'] += 1 if loopback
    $arrivals.write(format("%.6f\n", now)) if $arrivals
  end
end

def book(id)
  {
    'id' => id,
    'author' => 'William Shakespeare',
    'year' => 1595,
    'type' => 'paperback',
    'pages' => 200,
    'publisher' => 'PublisherA',
    'language' => 'English',
    'ISBN-10' => '1234567890',
    'ISBN-13' => '123-1234567890'
  }
end

def reply(res, status, body)
  res.status = status
  res['Content-Type'] = 'application/json'
  res.body = JSON.generate(body)
end

# TCP_NODELAY is set per accepted connection, in the accept hook WEBrick offers.
accept_cb = nodelay ? proc { |sock| sock.setsockopt(Socket::IPPROTO_TCP, Socket::TCP_NODELAY, 1) } : nil

server = WEBrick::HTTPServer.new(
  AcceptCallback: accept_cb,
  BindAddress: '0.0.0.0', Port: port,
  AccessLog: [], Logger: WEBrick::Log.new($stderr, WEBrick::Log::WARN),
  # Idle keep-alive connections are kept this long (WEBrick closes them after it).
  RequestTimeout: 60
)


server.mount_proc('/details') do |req, res|
  count(req)
  m = %r{\A/details/([^/]+)\z}.match(req.path)
  if req.request_method != 'GET' || m.nil?
    reply(res, 404, { 'error' => 'not found' })
  else
    begin
      reply(res, 200, book(Integer(m[1], 10)))
    rescue ArgumentError
      reply(res, 400, { 'error' => 'please provide numeric product ID' })
    end
  end
end

server.mount_proc('/health') do |req, res|
  reply(res, 200, { 'status' => 'Details is healthy' })
end

server.mount_proc('/internal/requests') do |req, res|
  snapshot = $lock.synchronize { $counts.dup }
  reply(res, 200, snapshot)
end

%w[INT TERM].each { |sig| trap(sig) { server.shutdown } }
server.start
