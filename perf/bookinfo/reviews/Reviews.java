// reviews: book reviews as JSON, each with the star rating fetched from the ratings service, on the
// JDK's own HTTP server (com.sun.net.httpserver), port 9080. Written for this project in the shape of
// Bookinfo's reviews service (v2: calls ratings, black stars); see perf/bookinfo/README.md.
// Calls to ratings go over a small pool of kept-alive HTTP/1.1 connections (class Pool).
//
//   java -cp build/bookinfo/reviews Reviews [port]    GET /reviews/<id>, GET /health, GET /internal/{requests,reset}
//   RATINGS_HOSTNAME / RATINGS_SERVICE_PORT   where ratings is (default ratings:9080)
//   ENABLE_RATINGS (default true), STAR_COLOR (default black), REVIEWS_THREADS (default 32)
//   BOOKINFO_ARRIVALS=<file>: each counted request appends its arrival time (seconds since the
//   epoch) to that file, one per line
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

import java.io.BufferedInputStream;
import java.io.ByteArrayOutputStream;
import java.io.EOFException;
import java.io.FileOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.Socket;
import java.nio.charset.StandardCharsets;
import java.util.ArrayDeque;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public final class Reviews {
    private static final Pattern PATH = Pattern.compile("^/reviews/([^/]+)$");
    private static final Pattern STARS = Pattern.compile("\"(Reviewer[12])\"\\s*:\\s*([0-9]+)");
    private static final AtomicLong REQUESTS = new AtomicLong();
    private static final AtomicLong FROM_LOOPBACK = new AtomicLong();
    private static final OutputStream ARRIVALS = openArrivals();

    private static final String TEXT1 = "An extremely entertaining play by Shakespeare. The slapstick humour is refreshing!";
    private static final String TEXT2 = "Absolutely fun and entertaining. The play lacks thematic depth when compared to other plays by Shakespeare.";

    private final Pool pool;
    private final String ratingsPath;
    private final boolean ratingsEnabled;
    private final String color;

    private Reviews() {
        String host = env("RATINGS_HOSTNAME", "ratings");
        String port = env("RATINGS_SERVICE_PORT", "9080");
        pool = new Pool(host, Integer.parseInt(port));
        ratingsPath = "/ratings/";
        ratingsEnabled = Boolean.parseBoolean(env("ENABLE_RATINGS", "true"));
        color = env("STAR_COLOR", "black");
    }

    /** A GET on ratings, over a pooled keep-alive connection of {@link Pool}, in the calling thread.
     * Returns the body, or null on a non-200 status. */
    private String fetchRatings(String id) throws IOException {
        return pool.get(ratingsPath + id);
    }

    private static OutputStream openArrivals() {
        String path = System.getenv("BOOKINFO_ARRIVALS");
        if (path == null || path.isEmpty()) {
            return null;
        }
        try {
            return new FileOutputStream(path, true);
        } catch (IOException e) {
            throw new IllegalStateException("BOOKINFO_ARRIVALS: " + path + ": " + e.getMessage(), e);
        }
    }

    private static void arrived(long nanosSinceEpoch) throws IOException {
        if (ARRIVALS != null) {
            byte[] line = String.format("%d.%06d%n", nanosSinceEpoch / 1_000_000_000L,
                                        (nanosSinceEpoch % 1_000_000_000L) / 1000).getBytes(StandardCharsets.US_ASCII);
            synchronized (ARRIVALS) {
                ARRIVALS.write(line);
            }
        }
    }

    private static String env(String name, String dflt) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? dflt : v;
    }

    private static String quote(String s) {
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }

    /** The rating part of one review: stars and color, or Bookinfo's error text when ratings failed. */
    private static String rating(int stars, String color, String error) {
        if (error != null) {
            return "{\"error\":" + quote(error) + "}";
        }
        return "{\"stars\":" + stars + ",\"color\":" + quote(color) + "}";
    }

    private String reviews(String id) {
        int s1 = -1;
        int s2 = -1;
        String error = null;
        if (ratingsEnabled) {
            try {
                String body = fetchRatings(id);
                if (body == null) {
                    error = "Ratings service is currently unavailable";
                } else {
                    Matcher m = STARS.matcher(body);
                    while (m.find()) {
                        if (m.group(1).equals("Reviewer1")) {
                            s1 = Integer.parseInt(m.group(2));
                        } else {
                            s2 = Integer.parseInt(m.group(2));
                        }
                    }
                }
            } catch (IOException e) {
                error = "Ratings service is currently unavailable";
            }
        }
        StringBuilder b = new StringBuilder(512);
        b.append("{\"id\":").append(quote(id)).append(",\"podname\":").append(quote(env("HOSTNAME", "reviews")))
         .append(",\"clustername\":\"null\",\"reviews\":[");
        b.append("{\"reviewer\":\"Reviewer1\",\"text\":").append(quote(TEXT1));
        if (ratingsEnabled) {
            b.append(",\"rating\":").append(rating(s1, color, error));
        }
        b.append("},{\"reviewer\":\"Reviewer2\",\"text\":").append(quote(TEXT2));
        if (ratingsEnabled) {
            b.append(",\"rating\":").append(rating(s2, color, error));
        }
        b.append("}]}");
        return b.toString();
    }

    private static void send(HttpExchange ex, int status, String body) throws IOException {
        byte[] data = body.getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().set("Content-Type", "application/json");
        ex.sendResponseHeaders(status, data.length);
        try (OutputStream os = ex.getResponseBody()) {
            os.write(data);
        }
    }

    private void handle(HttpExchange ex) throws IOException {
        String path = ex.getRequestURI().getPath();
        if (path.equals("/health")) {
            send(ex, 200, "{\"status\":\"Reviews is healthy\"}");
            return;
        }
        if (path.equals("/internal/reset")) {
            // The lab's switch between topologies: no connection made before the node's traffic
            // capture changed may be reused.
            pool.reset();
            send(ex, 200, "{\"reset\":true}");
            return;
        }
        if (path.equals("/internal/requests")) {
            send(ex, 200, "{\"requests\":" + REQUESTS.get() + ",\"from_loopback\":" + FROM_LOOPBACK.get() + "}");
            return;
        }
        java.time.Instant now = java.time.Instant.now();
        REQUESTS.incrementAndGet();
        arrived(now.getEpochSecond() * 1_000_000_000L + now.getNano());
        if (ex.getRemoteAddress().getAddress().isLoopbackAddress()) {
            FROM_LOOPBACK.incrementAndGet();
        }
        Matcher m = PATH.matcher(path);
        if (!"GET".equals(ex.getRequestMethod()) || !m.matches()) {
            send(ex, 404, "{\"error\":\"not found\"}");
            return;
        }
        String id = m.group(1);
        if (!id.matches("[0-9]+")) {
            send(ex, 400, "{\"error\":\"please provide numeric product ID\"}");
            return;
        }
        send(ex, 200, reviews(id));
    }

    public static void main(String[] args) throws IOException {
        int port = Integer.parseInt(args.length > 0 ? args[0] : env("PORT", "9080"));
        int threads = Integer.parseInt(env("REVIEWS_THREADS", "32"));
        Reviews app = new Reviews();
        HttpServer server = HttpServer.create(new InetSocketAddress("0.0.0.0", port), 1024);
        server.createContext("/", ex -> {
            try {
                app.handle(ex);
            } finally {
                ex.close();
            }
        });
        server.setExecutor(Executors.newFixedThreadPool(threads));
        Runtime.getRuntime().addShutdownHook(new Thread(() -> server.stop(0)));
        server.start();
    }

    /** A small HTTP/1.1 client with a pool of kept-alive connections to one address: a call takes an
     * idle connection (or opens one), sends a GET, reads the response (Content-Length or chunked),
     * and gives the connection back unless the server said `Connection: close`. A call on a pooled
     * connection that the server closed meanwhile is retried once on a new connection. */
    static final class Pool {
        private final String host;
        private final int port;
        private final ArrayDeque<Conn> idle = new ArrayDeque<>();

        Pool(String host, int port) {
            this.host = host;
            this.port = port;
        }

        private static final class Conn {
            final Socket socket;
            final BufferedInputStream in;
            final OutputStream out;

            Conn(Socket s) throws IOException {
                socket = s;
                in = new BufferedInputStream(s.getInputStream(), 8192);
                out = s.getOutputStream();
            }
        }

        synchronized void reset() {
            for (Conn c : idle) {
                try {
                    c.socket.close();
                } catch (IOException ignored) {
                    // closing anyway
                }
            }
            idle.clear();
        }

        private synchronized Conn take() {
            return idle.pollFirst();
        }

        private synchronized void give(Conn c) {
            idle.addFirst(c);
        }

        private Conn open() throws IOException {
            Socket s = new Socket();
            s.setTcpNoDelay(true);
            s.connect(new InetSocketAddress(host, port), 2000);
            s.setSoTimeout(10000);
            return new Conn(s);
        }

        String get(String path) throws IOException {
            Conn c = take();
            if (c != null) {
                try {
                    return exchange(c, path);
                } catch (IOException stale) {
                    c.socket.close();
                }
            }
            return exchange(open(), path);
        }

        private String exchange(Conn c, String path) throws IOException {
            String req = "GET " + path + " HTTP/1.1\r\nHost: " + host + ":" + port
                    + "\r\nAccept: application/json\r\n\r\n";
            c.out.write(req.getBytes(StandardCharsets.US_ASCII));
            c.out.flush();
            String status = line(c.in);
            int code = Integer.parseInt(status.split(" ")[1]);
            long length = -1;
            boolean chunked = false;
            boolean close = status.startsWith("HTTP/1.0");
            for (String h = line(c.in); !h.isEmpty(); h = line(c.in)) {
                String k = h.substring(0, Math.max(0, h.indexOf(':'))).trim().toLowerCase();
                String v = h.substring(h.indexOf(':') + 1).trim().toLowerCase();
                if (k.equals("content-length")) {
                    length = Long.parseLong(v);
                } else if (k.equals("transfer-encoding") && v.contains("chunked")) {
                    chunked = true;
                } else if (k.equals("connection")) {
                    close = v.contains("close");
                }
            }
            ByteArrayOutputStream body = new ByteArrayOutputStream(256);
            if (chunked) {
                for (long n = Long.parseLong(line(c.in).split(";")[0].trim(), 16); n > 0;
                     n = Long.parseLong(line(c.in).split(";")[0].trim(), 16)) {
                    body.write(c.in.readNBytes((int) n));
                    line(c.in);
                }
                while (!line(c.in).isEmpty()) {
                    // trailers
                }
            } else if (length >= 0) {
                byte[] b = c.in.readNBytes((int) length);
                if (b.length < length) {
                    throw new EOFException("short body");
                }
                body.write(b);
            } else {
                body.write(c.in.readAllBytes());
                close = true;
            }
            if (close) {
                c.socket.close();
            } else {
                give(c);
            }
            return code == 200 ? body.toString(StandardCharsets.UTF_8) : null;
        }

        private static String line(InputStream in) throws IOException {
            StringBuilder b = new StringBuilder(64);
            for (int ch = in.read(); ch != '\n'; ch = in.read()) {
                if (ch < 0) {
                    throw new EOFException("connection closed");
                }
                if (ch != '\r') {
                    b.append((char) ch);
                }
            }
            return b.toString();
        }
    }
}
