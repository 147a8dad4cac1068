import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.io.StreamTokenizer;
import java.io.StringReader;
import java.nio.charset.StandardCharsets;

/**
 * Prints the tokens Kafka's JaasConfig reads from each input line (the same StreamTokenizer
 * syntax), for tests/test_jaas.py to compare with flinkish_core.jaas. Lines in and out are hex
 * (four digits per UTF-16 unit), so that any text, line breaks included, fits on one line.
 */
public class JaasTokens {
    public static void main(String[] args) throws Exception {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            StringBuilder decoded = new StringBuilder();
            for (int i = 0; i + 4 <= line.length(); i += 4) {
                decoded.append((char) Integer.parseInt(line.substring(i, i + 4), 16));
            }
            String text = decoded.toString();
            StreamTokenizer t = new StreamTokenizer(new StringReader(text));
            t.resetSyntax();
            t.wordChars(32, 128);
            t.wordChars(128 + 32, 255);
            t.ordinaryChar(';');
            t.ordinaryChar('=');
            t.whitespaceChars(0, ' ');
            t.commentChar('/');
            t.quoteChar('"');
            t.quoteChar('\'');
            t.slashSlashComments(true);
            t.slashStarComments(true);
            StringBuilder out = new StringBuilder();
            while (t.nextToken() != StreamTokenizer.TT_EOF) {
                String kind = t.ttype == StreamTokenizer.TT_WORD ? "word"
                        : (t.ttype == '"' || t.ttype == '\'') ? "quoted" : "ordinary";
                String text2 = t.sval != null ? t.sval : String.valueOf((char) t.ttype);
                out.append(kind).append('\u0001');
                for (char c : text2.toCharArray()) out.append(String.format("%04x", (int) c));
                out.append('\u0002');
            }
            System.out.println(out);
        }
    }
}
