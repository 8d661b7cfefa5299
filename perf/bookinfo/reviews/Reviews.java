// reviews: book reviews as JSON, each with the star rating fetched from the ratings service, on the
// JDK's own HTTP server (com.sun.net.httpserver), port 9080. Written for this project in the shape of
// Bookinfo's reviews service (v2: calls ratings, black stars); see perf/bookinfo/README.md.
//
//   java -cp build/bookinfo/reviews Reviews [port]    GET /reviews/<id>, GET /health, GET /internal/requests
//   RATINGS_HOSTNAME / RATINGS_SERVICE_PORT   where ratings is (default ratings:9080)
//   ENABLE_RATINGS (default true), STAR_COLOR (default black), REVIEWS_THREADS (default 32)
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;

import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicLong;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public final class Reviews {
    private static final Pattern PATH = Pattern.compile("^/reviews/([^/]+)$");
    private static final Pattern STARS = Pattern.compile("\"(Reviewer[12])\"\\s*:\\s*([0-9]+)");
    private static final AtomicLong REQUESTS = new AtomicLong();
    private static final AtomicLong FROM_LOOPBACK = new AtomicLong();

    private static final String TEXT1 = "An extremely entertaining play by Shakespeare. The slapstick humour is refreshing!";
    private static final String TEXT2 = "Absolutely fun and entertaining. The play lacks thematic depth when compared to other plays by Shakespeare.";

    private final HttpClient client;
    private final String ratingsBase;
    private final boolean ratingsEnabled;
    private final String color;

    private Reviews() {
        String host = env("RATINGS_HOSTNAME", "ratings");
        String port = env("RATINGS_SERVICE_PORT", "9080");
        ratingsBase = "http://" + host + ":" + port + "/ratings/";
        ratingsEnabled = Boolean.parseBoolean(env("ENABLE_RATINGS", "true"));
        color = env("STAR_COLOR", "black");
        // One pooled HTTP/1.1 client for all calls to ratings (kept-alive connections are reused).
        client = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1)
                .connectTimeout(Duration.ofSeconds(2)).build();
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
                HttpRequest req = HttpRequest.newBuilder(URI.create(ratingsBase + id))
                        .timeout(Duration.ofSeconds(10)).GET().build();
                HttpResponse<String> r = client.send(req, HttpResponse.BodyHandlers.ofString());
                if (r.statusCode() != 200) {
                    error = "Ratings service is currently unavailable";
                } else {
                    Matcher m = STARS.matcher(r.body());
                    while (m.find()) {
                        if (m.group(1).equals("Reviewer1")) {
                            s1 = Integer.parseInt(m.group(2));
                        } else {
                            s2 = Integer.parseInt(m.group(2));
                        }
                    }
                }
            } catch (IOException | InterruptedException e) {
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
        if (path.equals("/internal/requests")) {
            send(ex, 200, "{\"requests\":" + REQUESTS.get() + ",\"from_loopback\":" + FROM_LOOPBACK.get() + "}");
            return;
        }
        REQUESTS.incrementAndGet();
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
}
